"""How a call's cost grows with the compute before it: the wait for the slowest rank, a random walk and a drift.

Each rank's compute is a sum of many small ops of independently jittered length, so two ranks' finishing
times drift apart as a random walk's, with the square root of the compute. But the development VM's vCPUs
also run at different speeds for seconds at a time: in one window (2026-11-27 23:3x, 2 ranks, ``phase_worker``'s
loops) one rank computed 8 units in 13.8 ms and the other in 22-24 ms for a dozen repetitions running, while
each rank's thread had its core 97-99 % of the wall time it computed (``time.thread_time``), so the core ran
slower, not shared. The lag then grows with the compute itself: the loops' mean lag was 0.34 / 0.30 / 0.30 /
0.24 of 9 / 18 / 36 / 72 ms of compute, and the call after each cost the late rank's call (2.4-3.5 ms, flat)
plus half the lag (the early rank waits it, the late one not at all). So the calls are fitted on both,
``a + b sqrt(compute) + c compute`` with ``b, c >= 0`` (least squares; a square root alone, fitted on calls
that grow as a line, over-states the middle of the curve: a 0.15 ms per ms rise read 4.6 ms at 22 ms of
compute against 2.9), and the curve is that fit's rise from the first loop.
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
    over the five loops. Read point by point (each the call beyond the first, held from falling) the curve took
    each loop's noise whole: at 2 ranks the point after 8 units read 0.57 to 2.76 ms across six calibrations of
    one hour, and holding it from falling raised every dip (docs/calibration.md). The record keeps the calls as
    measured."""
    points = [phase_cost([r["phases"][f"{kind}{units}"] for r in ranks]) for units in PHASE_UNITS]
    phases, calls = [p for p, _ in points], [c for _, c in points]
    extras = rise_fit(phases, calls) if len(set(phases)) > 1 else [0.0] * len(phases)
    return phases, extras, {"phase_s": phases, "call_s": calls}


def later_steps(calls: list[float], extras: list[float], steps: float, wake: float) -> float:
    """What a call's ring steps after its first pay beyond their price, after a compute (``phase_worker``'s loops,
    at every world size): the mean of the loops' calls (``calls``) over what the simulator charges them,
    their steps (``steps``, the ring's price of the loops' all-reduce), the first call's wake and the curve's rise
    (``extras``), at 0 or more. Why the later steps: at 2 ranks the loops' all-reduces (two ring steps) read above
    that price in 19 of 21 calibrations (+0.64 ms on average, most after 4 to 16 units), while the ZeRO stages'
    calls of one step after their backward and step were priced within a few per cent, and DDP's all-reduce of
    4 bytes in its own step spent 2.1 ms on average in its second exchange against the ring's 0.86 ms a step
    (docs/calibration.md, the fortieth stop). Where the ranks outnumber the cores the loops sat above their price
    too, the ring's in 6 of 7 calibrations at 4 ranks (+2.3 ms on average) and 5 of 6 at 8 (+3.4 ms), while the
    executor's own calls there took 1.0-1.6 ms a step more than the ring's price once every rank had entered them
    (zero1 and ddp at 4 ranks, forty-ninth stop): fitted there as well since profile version 20."""
    if not calls:
        return 0.0
    return max(statistics.fmean(call - steps - wake - extra for call, extra in zip(calls, extras)), 0.0)
