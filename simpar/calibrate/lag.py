"""How a call's cost grows with the compute before it: the wait for the slowest rank. Each rank's compute is
a sum of many jittered ops, so the ranks' finishing times drift apart as a random walk's (with the square root
of the compute), and where cores run at different speeds with the compute itself: the calls are fitted on
``a + b sqrt(compute) + c compute`` (``b, c >= 0``), and the curve is that fit's rise from the first loop."""

from __future__ import annotations

import itertools
import statistics

import numpy as np

from simpar.calibrate.bench import PHASE_UNITS, phase_cost


def rise_fit(phases: list[float], calls: list[float]) -> list[float]:
    """What the least-squares fit of ``calls`` on ``a + b sqrt(phase) + c phase`` (``b, c >= 0``: the best of
    the term sets whose coefficients come out non-negative) rises by from the first phase to each."""
    x, y = np.asarray(phases, dtype=float), np.asarray(calls, dtype=float)
    terms = {"root": np.sqrt(x), "line": x}
    best, best_error = np.zeros(len(x)), np.inf
    for size in (2, 1, 0):
        for chosen in itertools.combinations(terms, size):
            basis = np.column_stack([np.ones(len(x)), *(terms[t] for t in chosen)])
            coefficients = np.linalg.lstsq(basis, y, rcond=None)[0]
            if np.any(coefficients[1:] < 0):
                continue
            fitted = basis @ coefficients
            error = float(np.sum((y - fitted) ** 2))
            if error < best_error - 1e-30:
                best, best_error = fitted, error
    return [float(f - best[0]) for f in best]


def wake_curve(ranks: list[dict], kind: str = "") -> tuple[list[float], list[float], dict]:
    """(the compute before the call of each ``PHASE_UNITS`` loop ``phase_worker`` ran, what the call costs beyond
    the first loop's by ``rise_fit``, the calls as measured)."""
    loops = [f"{kind}{units}" for units in PHASE_UNITS if f"{kind}{units}" in ranks[0]["phases"]]
    points = [phase_cost([r["phases"][loop] for r in ranks]) for loop in loops]
    phases, calls = [p for p, _ in points], [c for _, c in points]
    extras = rise_fit(phases, calls) if len(set(phases)) > 1 else [0.0] * len(phases)
    return phases, extras, {"phase_s": phases, "call_s": calls}


def later_steps(calls: list[float], extras: list[float], steps: float, wake: float) -> float:
    """What a call's ring steps after its first pay beyond their price after a compute: the mean of the loops'
    calls over what the simulator charges them (their ``steps``' price, the wake, the curve's rise), at 0 or
    more (a one-step call after the same compute pays none of it: the stall falls on the later steps)."""
    if not calls:
        return 0.0
    return max(statistics.fmean(call - steps - wake - extra for call, extra in zip(calls, extras)), 0.0)
