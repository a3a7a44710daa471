"""A pipeline send's hold drawn from its measured spread, not priced at its mean.

On the CPU executor a pipeline send's ``isend`` holds its rank a fraction of a millisecond most of the
time and now and then a scheduler slice, the woken receiver's: the calibration's isends held 0.05 ms
at the median and 0.3 ms on average at 2 ranks (p99 5 ms). A pipeline step is a chain of maxima: a
stage goes on with the later of its own work and its neighbour's message, and the mean of a maximum
exceeds the maximum of the means. Priced at its mean no stall ever lands on the step's critical path,
where in a run the ones that do set the step: walked back from the first stage's end, a 4-rank run's
path held 7.9 ms of sends against 4.4 on the simulator's, its waits for messages as priced
(docs/calibration.md, "A pipeline's step is a max of its sends' holds").

So where a profile has measured the spread, the simulator prices a Plan with pipeline sends in the
executor's order ``DRAWS`` times, each send's hold drawn from it, and reports the mean step
(``sim/__init__.py``; with streams overlapping a send holds nothing, so nothing is drawn). A late
receive stays at its mean: its waits on the path were priced right, and drawn from the calibration's
spread as well it priced pp 10-12 % long at 4 and 8 ranks. A spread is the quantile function of the
samples over their mean, scaled to mean 1: the draws keep the calibrated mean, and a spread of ones
prices exactly as the mean does. Draws are seeded (draw i uses seed i), so a price is the same every
time it is asked for. A Program standing for several identical ranks (pipeline stages replicated for
data parallelism) draws once for all of them.
"""

from __future__ import annotations

import numpy as np

from simpar.plan import Send

SPREAD_POINTS = 101  # probabilities 0, 1 %, ..., 100 % of a measured spread
DRAWS = 64  # draws a price averages: one draw's step spreads by 2-5 % (SD) at 2-8 ranks, their mean by under 1 %


def spread_of(samples: list[float]) -> list[float]:
    """The quantile function of ``samples`` over their mean at ``SPREAD_POINTS`` evenly spaced probabilities,
    scaled so that its mean, read between the points as ``factor`` reads it, is exactly 1 ([] for fewer than
    two samples or none above 0)."""
    values = np.asarray(samples, dtype=float)
    if len(values) < 2 or values.mean() <= 0:
        return []
    quantiles = np.quantile(values, np.linspace(0.0, 1.0, SPREAD_POINTS)) / values.mean()
    return [float(q) for q in quantiles / np.trapezoid(quantiles, dx=1.0 / (SPREAD_POINTS - 1))]


def factor(spreads: dict[int, list[float]] | None, runnable: float, u: float) -> float:
    """A cost over its mean at probability ``u`` (0-1) with ``runnable`` ranks: each measured world's spread
    read at ``u``, interpolated between worlds and held at the ends as the means are (``_by_ranks``); 1 without
    spreads. Its mean over ``u`` is 1 at any ``runnable``."""
    if not spreads:
        return 1.0
    keys = sorted(spreads)
    at = [float(np.interp(u, np.linspace(0.0, 1.0, len(spreads[k])), spreads[k])) for k in keys]
    return float(np.interp(runnable, keys, at))


def draws_for(topology, plan, serial: bool) -> int:
    """How many draws a price of ``plan`` on ``topology`` averages: ``DRAWS`` where the topology carries a send's
    measured spread and the plan sends pipeline messages between ranks sharing cores, priced ``serial``ly (as the
    executor runs them: only there does a send hold its sender), else 0 (one run at the means: nothing to draw)."""
    if not serial or not topology.send_issue_spread or topology.core_slowdown is None:
        return 0
    return DRAWS if any(isinstance(op, Send) for prog in plan.programs for op in prog.ops) else 0
