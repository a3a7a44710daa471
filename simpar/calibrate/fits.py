"""The fits of the calibration's rows. A unit's forward or backward takes ``overhead[kind] + flops / rate``
(the overhead is the framework's per-op cost, which dominates small models on a CPU); a collective of k ring
steps of s bytes ``k (alpha + s / bandwidth)``, the first after computing ``wake`` more; the executor's own
work (a collective's data handled, the optimizer step) a line per tensor and per element or parameter."""

from __future__ import annotations

import statistics

import numpy as np

from simpar.collectives.ring import ring_steps

UNIT_KINDS = ("embedding", "layer", "head")
SERIES = 4  # calls in a row after a unit's compute in pattern_worker's series (and 1): the step latency's fit


def fit_line(xs, ys) -> tuple[float, float]:
    """(intercept, slope) of a Theil-Sen line, both non-negative: a few timings disturbed by the scheduler do
    not tilt it, as they would a least-squares fit."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    pairs = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
             if xs[j] != xs[i]]
    if not pairs:
        return float(max(np.median(ys), 0.0)), 0.0
    slope = max(float(np.median(pairs)), 0.0)
    intercept = float(np.median(ys - slope * xs))
    if intercept < 0:  # through the origin instead
        return 0.0, float(np.median(ys[xs > 0] / xs[xs > 0]))
    return intercept, slope


def fit_unit_costs(rows: list[dict], phase: str, extras: tuple[str, ...] = ()) -> tuple[list[float], dict]:
    """([overhead of an embedding, a layer, a head, FLOP/s], {extra: seconds per one}) fitted to ``rows`` by
    least squares of the relative error (units span 0.1 to 4 ms), non-negative. ``extras``: "scores", a
    layer's attention scores (batch x heads x seq^2: the CPU attention kernel's work per score)."""
    design = np.array([[r["unit"] == k for k in UNIT_KINDS] + [r.get(extra, 0) for extra in extras]
                       + [r[f"{phase}_flops"]] for r in rows], dtype=float)
    coefficients = _nonnegative_fit(design, np.array([r[f"{phase}_s"] for r in rows]))
    per_flop = max(float(coefficients[-1]), 1e-15)
    overheads = [float(c) for c in coefficients[:len(UNIT_KINDS)]]
    per_extra = {extra: float(coefficients[len(UNIT_KINDS) + i]) for i, extra in enumerate(extras)}
    return overheads + [1.0 / per_flop], per_extra


def _nonnegative_fit(design: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares of the relative error, every term but the last (the FLOPs') non-negative: one that fits
    below zero is fixed at zero and the rest refitted."""
    weight = 1.0 / np.maximum(seconds, 1e-9)  # relative error; a zero timing (none in practice) stays finite
    free = list(range(design.shape[1]))
    while True:
        coefficients = np.zeros(design.shape[1])
        coefficients[free] = np.linalg.lstsq(design[:, free] * weight[:, None], seconds * weight, rcond=None)[0]
        negative = [i for i in free[:-1] if coefficients[i] < 0]  # the FLOP term always stays
        if not negative:
            return coefficients
        free.remove(min(negative, key=lambda i: coefficients[i]))


def step_bytes(op: str, size: int, world: int) -> float:
    """Bytes one step of a call of ``size`` bytes moves: a ring step 1/world of it, a handoff or a Worker-Server
    leg the whole."""
    return max(size // 4, world) * 4 / (1 if op in ("handoff", "psreduce") else world)


def ring_price(op: str, size: int, world: int, alpha: float, bandwidth: float) -> float:
    """Seconds a fitted ring (``alpha`` per step, ``bandwidth`` bytes/s) prices one ``op`` of ``size`` bytes."""
    return ring_steps(op, world) * (alpha + step_bytes(op, size, world) / bandwidth)


def fit_collective_costs(rows: list[dict], wake: float | None = None) -> tuple[float, float, float, float, float]:
    """(wake, handoff wake, per-step seconds, bytes/s, the handoff's per-step seconds) of ``seconds = wake[op] +
    calls x steps (alpha + step_bytes / bandwidth)`` fitted to ``pattern_rows``: one step latency and bandwidth
    for collectives and handoffs, a wake each (a collective waits for its whole group, a handoff for one
    neighbour). A ``wake`` measured apart (``series_wake``) is taken as given; terms below zero are fixed at 0."""
    def steps(row: dict) -> int:  # ring steps (or handoffs) a row's calls take in all
        return row.get("calls", 1) * row["steps"]

    design = np.array([[float(r["op"] != "handoff"), float(r["op"] == "handoff"), steps(r),
                        steps(r) * r["step_bytes"]] for r in rows])
    seconds = np.array([r["seconds"] for r in rows])
    if wake is not None:
        seconds = seconds - wake * design[:, 0]
        design[:, 0] = 0.0
    fitted, handoff, alpha, per_byte = _nonnegative(design, seconds)
    return (fitted if wake is None else wake), handoff, alpha, 1.0 / per_byte if per_byte > 0 else 1e12, alpha


def _nonnegative(design: np.ndarray, seconds: np.ndarray) -> list[float]:
    """Least-squares coefficients, a column that fits below zero fixed at zero (and the rest refitted)."""
    free = [i for i in range(design.shape[1]) if design[:, i].any()]
    while True:
        coefficients = np.zeros(design.shape[1])
        if free:
            coefficients[free] = np.linalg.lstsq(design[:, free], seconds, rcond=None)[0]
        negative = [i for i in free if coefficients[i] < 0]
        if not negative:
            return [float(c) for c in coefficients]
        free.remove(min(negative, key=lambda i: coefficients[i]))


def fit_compute(alone: list[dict]) -> tuple[dict, list[float], list[float]]:
    """({phase: unit costs}, [forward, backward] seconds per attention score, the optimizer step [seconds,
    params/s]) fitted to ``average_passes``' rows."""
    compute, scores = {}, []
    for phase in ("fwd", "bwd"):
        compute[phase], fitted = fit_unit_costs(alone, phase, ("scores",))
        scores.append(fitted["scores"])
    return compute, scores, fit_optimizer_step(alone)


def fit_handling(alone: list[dict]) -> dict[str, list[float]]:
    """{kind: [seconds per parameter tensor, per parameter]} of the executor's handling of a data-parallel call's
    data: "" an all-reduce's, and ZeRO's ways (``fit_sharded_work``)."""
    return {"": fit_tensor_work(alone), **fit_sharded_work(alone)}


def fit_tensor_work(alone: list[dict], key: str = "reduce_s") -> list[float]:
    """[seconds per parameter tensor, per parameter] of the one-rank all-reduce op (``key``: another op's
    handling) over models of different tensors and parameters, least squares through the origin, a term
    below zero left out; [] for rows without ``key``."""
    rows = list({(row["model"], row["batch"]): row for row in alone if key in row}.values())
    if len({(row["tensors"], row["params"]) for row in rows}) < 2:
        return []
    design = np.array([[row["tensors"], row["params"]] for row in rows], dtype=float)
    seconds = np.array([row[key] for row in rows])
    fit = np.linalg.lstsq(design, seconds, rcond=None)[0]
    if min(fit) < 0:  # one term alone
        keep = int(np.argmax(fit))
        fit = np.zeros(2)
        fit[keep] = float(np.linalg.lstsq(design[:, [keep]], seconds, rcond=None)[0][0])
    return [float(fit[0]), float(fit[1])]


def fit_sharded_work(alone: list[dict]) -> dict[str, list[float]]:
    """{"gather", "scatter", "accumulate": ``fit_tensor_work``} of the handling of ZeRO's calls and of a later
    micro-batch's gradients (handling.py)."""
    fits = {kind: fit_tensor_work(alone, f"{kind}_s") for kind in ("gather", "scatter", "accumulate")}
    # a cost fitted at or below zero is noise (accumulate_s is a difference of two timings): left out
    return {kind: fit for kind, fit in fits.items() if fit and min(fit) >= 0 < sum(fit)}


def fit_optimizer_step(alone: list[dict]) -> list[float]:
    """[overhead s, params/s] of the executor's Adam step op, a line through the models' (parameters, seconds);
    [] for a flat fit or a single size."""
    rows = {(row["model"], row["batch"]): row for row in alone if "step_s" in row}
    if len({row["params"] for row in rows.values()}) < 2:
        return []
    overhead, seconds_per_param = fit_line([row["params"] for row in rows.values()],
                                           [row["step_s"] for row in rows.values()])
    return [overhead, 1.0 / seconds_per_param] if seconds_per_param > 0 else []


def series_wake(series_by_rank: list[list[list[float]]]) -> float:
    """What the first of a series of calls after computing pays beyond each call after it (``pattern_worker``'s
    series): per repetition, the first call averaged over the ranks less the mean of the later ones; the mean
    over repetitions (paired inside each, so the machine's drift cancels)."""
    extra = []
    for marks in zip(*series_by_rank):  # one repetition, every rank
        calls = [statistics.fmean(m[i + 1] - m[i] for m in marks) for i in range(len(marks[0]) - 1)]
        extra.append(calls[0] - statistics.fmean(calls[1:]))
    return max(statistics.fmean(extra), 0.0) if extra else 0.0
