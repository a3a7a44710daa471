"""How fast this machine's cores ran over a stretch of time, read off the spinners that keep them awake.

Why: the development VM's cores change speed on their own, by up to 2-3x, for stretches of a quarter
second to seconds (the host's other guests: docs/calibration.md, "The host's speed, read while the ranks
run"). A run of a strategy and the calibration that prices it meet different speeds, and no timing taken
before or after a run follows it (a probe around each run correlated 0.40 with its step time). The
spinners (``awake.py``) run on every core whenever a rank does not, all through every gloo run, so they
can read the speed at no cost to the ranks: each counts the iterations of a fixed Python loop and the
CPU time it got (``time.thread_time``: the time it ran, not the time the ranks ran instead), and writes
both down about twenty times a second. Iterations per CPU second over a stretch is that stretch's
speed, the same reading whatever the ranks do (a core's loop rate was the same with the other core idle,
looping or multiplying matrices: the vCPUs share no physical core here).

A *reading* is the mean over the cores of each core's iterations per CPU second within ``[t0, t1]``
(wall-clock ``time.time()``), from every spinner trace this process has kept (``remember``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# a core's reading needs this much of its spinner's CPU time within the stretch (some 150,000
# iterations here): less is a few interrupted loops, not a rate
MIN_CPU_S = 0.005
KEEP_S = 6 * 3600.0  # traces older than this are dropped: a validate's window is an hour or two


@dataclass
class Trace:
    """One spinner's samples: (wall time, its CPU time, its iterations so far), in order."""

    core: int
    samples: list[tuple[float, float, int]] = field(default_factory=list)

    @classmethod
    def parse(cls, core: int, text: str) -> Trace:
        samples = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3:  # a line cut short by the spinner's kill is dropped
                samples.append((float(parts[0]), float(parts[1]), int(parts[2])))
        return cls(core, samples)

    def within(self, t0: float, t1: float) -> tuple[int, float]:
        """(iterations, CPU seconds) over the intervals between consecutive samples that overlap [t0, t1]
        (a stretch shorter than the 50 ms between samples is read over the interval around it)."""
        iterations, cpu = 0, 0.0
        for (w0, c0, n0), (w1, c1, n1) in zip(self.samples, self.samples[1:]):
            if w1 > t0 and w0 < t1:
                iterations, cpu = iterations + n1 - n0, cpu + c1 - c0
        return iterations, cpu


_TRACES: list[Trace] = []


def remember(traces: list[Trace]) -> None:
    """Keep ``traces`` (of spinners just stopped) for later readings; drop those older than ``KEEP_S``."""
    horizon = time.time() - KEEP_S
    _TRACES[:] = [t for t in _TRACES if t.samples and t.samples[-1][0] >= horizon]
    _TRACES.extend(t for t in traces if t.samples)


def reading(t0: float, t1: float, traces: list[Trace] | None = None) -> float | None:
    """The cores' speed over [t0, t1]: per core, the loop's iterations over its CPU seconds there, then
    the mean over the cores read; None where no core's spinner ran ``MIN_CPU_S`` within it (no spinners:
    ``SIMPAR_KEEP_AWAKE=0``, or a GPU run)."""
    per_core: dict[int, list[float]] = {}
    for trace in _TRACES if traces is None else traces:
        iterations, cpu = trace.within(t0, t1)
        totals = per_core.setdefault(trace.core, [0, 0.0])
        totals[0] += iterations
        totals[1] += cpu
    rates = [iterations / cpu for iterations, cpu in per_core.values() if cpu >= MIN_CPU_S]
    return sum(rates) / len(rates) if rates else None


def relative(speed: float | None, reference: float | None) -> float | None:
    """``speed`` over ``reference`` (how much faster the cores ran than then), None where either is unknown."""
    return speed / reference if speed and reference else None
