"""The fits and prices of the calibration's rows, apart from the profile they go into (profile.py).

A unit's forward or backward takes ``overhead[kind] + flops / rate`` (per phase, least squares of the relative
error; the overhead is the framework's per-op cost, which dominates small models on a CPU, and depends on how
many kernels the unit launches: an embedding few, a transformer layer dozens); a collective of k ring steps
moving s bytes each costs ``k (alpha + s / bandwidth)``, and the first one after computing ``wake`` more; a
line through timings disturbed by the scheduler is a Theil-Sen line; the executor's own work (the handling
of a collective's data, the optimizer step) is a line per tensor and per element or parameter.
"""

from __future__ import annotations

import statistics

import numpy as np

from simpar.calibrate.cold import COLD_KINDS, TAUS, cold_share
from simpar.collectives.ring import ring_steps

UNIT_KINDS = ("embedding", "layer", "head")


def fit_line(xs, ys) -> tuple[float, float]:
    """(intercept, slope) of a Theil-Sen line (the median of the pairwise slopes, then the median
    intercept): a few timings disturbed by the scheduler do not tilt it, as they would a least-squares
    fit. Both are kept non-negative."""
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


def fit_unit_costs(rows: list[dict], phase: str, extras: tuple[str, ...] = (),
                   tau: float = 0.0) -> tuple[list[float], dict]:
    """([overhead of an embedding, a layer, a head, FLOP/s], {extra: seconds per one of it}) fitted to ``rows``
    (kind, flops, seconds, and each of ``extras``: "table", the embedding's table elements; "scores", a
    layer's attention scores, batch x heads x seq^2; 0 where a row lacks it) by least squares
    on the relative error (each row weighted by 1 / its seconds) with non-negative terms: one that fits
    below zero (noise) is fixed at zero and the rest refitted without it. Relative, because the units a
    step sums span 0.1 to 4 ms and are judged by their relative error: least squares in seconds let small's
    4 ms units set the line and left tiny's (the shape of tiny-deep, which ``validate`` runs) one-sided,
    in every row of four calibrations of 2026-11-25: the layer's backward +8 % on average (-3 to +18 %),
    the head's forward +20 % (+5 to +40 %); weighted, +0.6 % and +1.2 %, small's within 4 % either way.
    The table term (the backward) prices the embedding's dense gradient: its backward writes a gradient of
    the whole vocab x hidden table (zeroed, then the tokens' rows added), and with tied embeddings adds it
    to the head's; isolated on one rank, 96-104 us for tiny's 16 K elements and 119-199 us for small's
    131 K, whatever the batch; one overhead for both made small's 10-45 % short and tiny-deep's 11-120 %
    long inside a step. The scores term prices the CPU attention kernel's
    work per score, whatever the head's size: interleaved on one rank, a layer of 8 heads of 8 took 9-20 %
    longer backward than one of 4 heads of 16 with the same FLOPs, the extra growing as seq^2 x heads
    (2.5-3.2 ns a score forward, 7-10 ns backward, at seq 32-128). With ``tau`` (and rows that timed their
    gaps) the embedding and the head pay ``cold_<kind>`` x their ops' mean ``1 - exp(-gap / tau)`` besides:
    the caches they find cold (calibrate/cold.py)."""
    design, seconds, extras = _unit_design(rows, phase, extras, tau)
    coefficients = _nonnegative_fit(design, seconds)
    per_flop = max(float(coefficients[-1]), 1e-15)
    overheads = [float(c) for c in coefficients[:len(UNIT_KINDS)]]
    per_extra = {extra: float(coefficients[len(UNIT_KINDS) + i]) for i, extra in enumerate(extras)}
    return overheads + [1.0 / per_flop], per_extra


def unit_fit_residual(rows: list[dict], phase: str, extras: tuple[str, ...], tau: float) -> float:
    """The sum of squared relative errors ``fit_unit_costs`` leaves on ``rows`` (how ``tau`` is chosen)."""
    design, seconds, _ = _unit_design(rows, phase, extras, tau)
    priced = design @ _nonnegative_fit(design, seconds)
    return float(np.sum((priced / seconds - 1.0) ** 2))


def _unit_design(rows: list[dict], phase: str, extras: tuple[str, ...], tau: float):
    if tau > 0 and all(f"{phase}_gaps" in r for r in rows):
        extras = extras + tuple(f"cold_{kind}" for kind in COLD_KINDS)
        rows = [{**r, **{f"cold_{k}": cold_share(r[f"{phase}_gaps"], tau) if r["unit"] == k else 0.0
                         for k in COLD_KINDS}} for r in rows]
    columns = [[r["unit"] == k for k in UNIT_KINDS] + [r.get(extra, 0) for extra in extras] + [r[f"{phase}_flops"]]
               for r in rows]
    return np.array(columns, dtype=float), np.array([r[f"{phase}_s"] for r in rows]), extras


def _nonnegative_fit(design: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares of the relative error with every term but the last (the FLOPs') non-negative: one
    that fits below zero is fixed at zero and the rest refitted without it."""
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
    """Bytes one step of a call of ``size`` bytes (fp32, at least one element a rank) moves: a ring step
    1/world of the buffer; a handoff or a Worker-Server leg the whole of it."""
    return max(size // 4, world) * 4 / (1 if op in ("handoff", "psreduce") else world)


def ring_price(op: str, size: int, world: int, alpha: float, bandwidth: float) -> float:
    """Seconds a fitted ring (``alpha`` per step, ``bandwidth`` bytes/s) prices one ``op`` of ``size`` bytes
    at ``world`` ranks, as ``fit_collective_costs`` fits it: its steps, each a latency and its bytes."""
    return ring_steps(op, world) * (alpha + step_bytes(op, size, world) / bandwidth)


def fit_collective_costs(rows: list[dict], wake: float | None = None,
                         own_handoff_step: bool = False) -> tuple[float, float, float, float, float]:
    """(wake seconds, handoff wake seconds, per-step seconds, bytes/s, handoff per-step seconds) of ``seconds =
    wake[op] + calls x steps (alpha + step_bytes / bandwidth)`` (a compute burst, then ``calls`` collectives of
    ``steps`` ring steps in a row, or ``calls`` pipeline handoffs of one step each) fitted to ``rows`` by least
    squares: one step latency and bandwidth for both (a handoff is one exchange with a neighbour, as a ring step
    is), a wake of their own (a collective's first call waits for the slowest of its whole group to finish
    computing, a handoff for one neighbour); the handoff's step latency is then the ring's. With
    ``own_handoff_step`` the collectives' wake, step latency and bandwidth are fitted on their rows alone and the
    handoffs' wake and step latency on theirs, at that bandwidth: with ``SIMPAR_GLOO_BATCH=1`` gloo's transport
    thread runs at SCHED_BATCH inside a collective, not around a pipeline's send and receive
    (real/gloo_threads.py), and fitted as one, the collectives' cheaper steps put a pipeline send's extra into its
    wake (at 2 ranks 0.99-1.63 ms against 0.0-0.21 with the threads as gloo made them; pp then read +13 to +27 %
    long). A collective ``wake`` measured apart (``series_wake``) is taken as given instead of fitted. A term
    that fits below zero (noise) is fixed at zero and the others refitted; a handoff wake without handoff rows
    is 0."""
    def steps(row: dict) -> int:  # ring steps (or handoffs) a row's calls take in all
        return row.get("calls", 1) * row["steps"]

    if not own_handoff_step:
        design = np.array([[float(r["op"] != "handoff"), float(r["op"] == "handoff"), steps(r),
                            steps(r) * r["step_bytes"]] for r in rows])
        seconds = np.array([r["seconds"] for r in rows])
        if wake is not None:
            seconds = seconds - wake * design[:, 0]
            design[:, 0] = 0.0
        fitted, handoff, alpha, per_byte = _nonnegative(design, seconds)
        return (fitted if wake is None else wake), handoff, alpha, 1.0 / per_byte if per_byte > 0 else 1e12, alpha
    collectives = [r for r in rows if r["op"] != "handoff"]
    handoffs = [r for r in rows if r["op"] == "handoff"]
    design = np.array([[1.0, steps(r), steps(r) * r["step_bytes"]] for r in collectives]).reshape(-1, 3)
    seconds = np.array([r["seconds"] for r in collectives])
    if wake is not None:
        seconds = seconds - wake
        design[:, 0] = 0.0
    fitted, alpha, per_byte = _nonnegative(design, seconds)
    bandwidth = 1.0 / per_byte if per_byte > 0 else 1e12
    if not handoffs:
        return (fitted if wake is None else wake), 0.0, alpha, bandwidth, alpha
    moved = np.array([steps(r) * r["step_bytes"] for r in handoffs]) * per_byte
    handoff, handoff_alpha = _nonnegative(np.column_stack([np.ones(len(handoffs)), [steps(r) for r in handoffs]]),
                                          np.array([r["seconds"] for r in handoffs]) - moved)
    return (fitted if wake is None else wake), handoff, alpha, bandwidth, handoff_alpha


def _nonnegative(design: np.ndarray, seconds: np.ndarray) -> list[float]:
    """Least-squares coefficients of ``design`` for ``seconds``, a column that fits below zero (noise) fixed at
    zero and the others refitted, and columns of zeros left at zero."""
    free = [i for i in range(design.shape[1]) if design[:, i].any()]
    while True:
        coefficients = np.zeros(design.shape[1])
        if free:
            coefficients[free] = np.linalg.lstsq(design[:, free], seconds, rcond=None)[0]
        negative = [i for i in free if coefficients[i] < 0]
        if not negative:
            return [float(c) for c in coefficients]
        free.remove(min(negative, key=lambda i: coefficients[i]))


def fit_compute(alone: list[dict]) -> tuple[dict, float, list[float], float, list[float], dict]:
    """({phase: unit costs} fitted to ``average_passes``' rows, the executor's work between ops per op of
    the plan: one figure for every model and batch, as it is Python around each op, not the op's work;
    its optimizer step [seconds per step, parameters per second]: a line over the models' sizes; seconds per
    element of the embedding's table in its backward; [forward, backward] seconds per attention score of a
    layer: ``fit_unit_costs``; the embedding's and head's cold caches, {"tau", "fwd", "bwd"}: the decay time
    of ``cold.TAUS`` that leaves the least relative error over both phases, {} for rows without gaps)."""
    phases = (("fwd", ("scores",)), ("bwd", ("table", "scores")))
    timed_gaps = all("fwd_gaps" in row for row in alone)
    tau = min(TAUS, key=lambda t: sum(unit_fit_residual(alone, phase, extras, t) for phase, extras in phases)) \
        if timed_gaps else 0.0
    compute, scores, cold = {}, [], {"tau": tau} if timed_gaps else {}
    for phase, extras in phases:
        compute[phase], fitted = fit_unit_costs(alone, phase, extras, tau)
        scores.append(fitted["scores"])
        if cold:
            cold[phase] = {kind: fitted[f"cold_{kind}"] for kind in COLD_KINDS}
    step = fit_optimizer_step(alone)
    return compute, statistics.fmean(row["between_ops_s"] for row in alone), step, fitted["table"], scores, cold


def fit_tensor_work(alone: list[dict], key: str = "reduce_s") -> list[float]:
    """[seconds per parameter tensor, seconds per parameter] of the executor's handling of the data around a
    data-parallel collective: one-rank all-reduce ops (no communication; ``key``: another op's handling,
    ``fit_sharded_work``) of models with different numbers of tensors and parameters, least squares
    through the origin (a term that fits below zero is left out and the other refitted); [] for rows from
    before it was timed."""
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
    """{"gather": ..., "scatter": ..., "accumulate": ...} as ``fit_tensor_work`` for ZeRO-1/2's all-gather of
    parameters held whole (a copy out of the gathered buffer into each: ``handling.time_gather``), ZeRO-2's
    handling of its gradients around the reduce-scatter (concatenated, then dropped: ``handling.time_scatter``)
    and a later micro-batch's gradients added into the held ones (``handling.time_accumulate``); a kind is
    left out for rows from before it was timed."""
    fits = {kind: fit_tensor_work(alone, f"{kind}_s") for kind in ("gather", "scatter", "accumulate")}
    # a cost fitted at or below zero is noise (accumulate_s is a difference of two timings): left out
    return {kind: fit for kind, fit in fits.items() if fit and min(fit) >= 0 < sum(fit)}


def adam_per_tensor(steps: list[dict]) -> float:
    """Seconds Adam's step costs per tensor beyond the first, from ``host_worker``'s rows: the split row (its
    parameters in ``tensors`` tensors) less the one-tensor row of as many parameters (else the one-tensor rows'
    line there), over the tensors beyond the first; at least 0, and 0 without a split row (older samples)."""
    one = [s for s in steps if s["optimizer"] == "adam" and "tensors" not in s]
    split = [s for s in steps if s["optimizer"] == "adam" and s.get("tensors", 1) > 1]
    if not split or not one:
        return 0.0
    row = split[0]
    same = [s["seconds"] for s in one if s["params"] == row["params"]]
    if same:
        whole = same[0]
    elif len({s["params"] for s in one}) > 1:
        overhead, seconds_per_param = fit_line([s["params"] for s in one], [s["seconds"] for s in one])
        whole = overhead + seconds_per_param * row["params"]
    else:
        return 0.0
    return max((row["seconds"] - whole) / (row["tensors"] - 1), 0.0)


def fit_optimizer_step(alone: list[dict]) -> list[float]:
    """[overhead s, params/s] of the executor's Adam step op, a line through (parameters, seconds) of the
    calibrated models (one point per model and batch: the batch does not change the step), less the
    gradients' concatenation it begins with where that was timed (``concat_s``: ``step_concat``, which
    ZeRO-2 and 3 do not pay); [] for rows from before the step was timed, or a flat fit (``fit_line`` keeps
    both terms non-negative)."""
    rows = {(row["model"], row["batch"]): row for row in alone if "step_s" in row}
    if len({row["params"] for row in rows.values()}) < 2:
        return []
    apart = all("concat_s" in row for row in rows.values())
    overhead, seconds_per_param = fit_line([row["params"] for row in rows.values()],
                                           [row["step_s"] - (row["concat_s"] if apart else 0.0)
                                            for row in rows.values()])
    if seconds_per_param <= 0:
        return []
    return [overhead, 1.0 / seconds_per_param]
