"""How a call's cost grows with the compute before it: the wait for the slowest rank.

Each rank's compute is a sum of many small ops of independently jittered length, so two ranks' finishing
times drift apart as a random walk's, with the square root of the compute; and where the cores run at
different speeds for seconds at a time, the lag grows with the compute itself. So the calls are fitted on
both, ``a + b sqrt(compute) + c compute`` with ``b, c >= 0`` (least squares), and the curve is that fit's rise
from the first loop.
"""

from __future__ import annotations

import itertools
import statistics

import numpy as np

from simpar.calibrate.bench import PHASE_UNITS, phase_cost


def rise_fit(phases: list[float], calls: list[float]) -> list[float]:
    """What the least-squares fit of ``calls`` on ``a + b sqrt(phase) + c phase`` (``b, c >= 0``) rises by from
    the first phase to each (seconds; the same list's length): the fit over each set of the two terms (both,
    either, neither) whose coefficients come out non-negative, the one of least squared error."""
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
    """(the compute before the call after each of ``PHASE_UNITS``' loops of ``phase_worker``, seconds, and
    what the call costs beyond the call after the first, shortest, loop, the record): how a call's cost grows
    with the compute before it (``kind`` "ps": the Worker-Server all-reduce's loops), the rise of ``rise_fit``
    over the loops (read point by point, the curve would take each loop's noise whole). The record keeps the
    calls as measured."""
    points = [phase_cost([r["phases"][f"{kind}{units}"] for r in ranks]) for units in PHASE_UNITS]
    phases, calls = [p for p, _ in points], [c for _, c in points]
    extras = rise_fit(phases, calls) if len(set(phases)) > 1 else [0.0] * len(phases)
    return phases, extras, {"phase_s": phases, "call_s": calls}


def later_steps(calls: list[float], extras: list[float], steps: float, wake: float) -> float:
    """What a call's ring steps after its first pay beyond their price, after a compute (``phase_worker``'s loops,
    at every world size): the mean of the loops' calls (``calls``) over what the simulator charges them,
    their steps (``steps``, the ring's price of the loops' all-reduce), the first call's wake and the curve's rise
    (``extras``), at 0 or more. The loops' all-reduces (two ring steps at 2 ranks) read above that price after a
    compute, where a one-step call after the same compute does not: the stall falls on the steps after the
    first."""
    if not calls:
        return 0.0
    return max(statistics.fmean(call - steps - wake - extra for call, extra in zip(calls, extras)), 0.0)
