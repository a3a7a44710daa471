"""The cores of one machine shared by the rank processes computing on it at the moment.

The executor's CPU ranks are processes on a machine with fewer cores than ranks (8 ranks on 2
cores). How much slower each computes depends on how many compute *at that moment*: every rank
of a data-parallel step computes its forward at once, but a pipeline's stages take turns (warm-up,
bubbles, stages waiting on a receive, which takes no core). So compute is processor sharing: a
compute op is work (its seconds on a machine to itself), and while n ranks compute at once each
progresses at 1 / slowdown(n) of a second per second, slowdown(n) = max(1, n / cores): the cores
shared evenly (a calibrated profile's ``core_slowdown``). A Program standing for several identical
ranks counts as that many.
"""

from __future__ import annotations

import numpy as np
import simpy

TOLERANCE = 1e-12  # seconds of work left that count as done (floating-point residue)


def slowdown_at(table: dict[int, float], ranks: int) -> float:
    """``table`` (ranks computing at once -> time factor, measured) at ``ranks``: interpolated between
    measured counts; beyond the largest, the cores shared in proportion; 1 for a rank alone."""
    if ranks <= 1:
        return 1.0
    keys = sorted(table)
    if ranks > keys[-1]:
        return table[keys[-1]] * ranks / keys[-1]
    return float(np.interp(ranks, keys, [table[k] for k in keys]))


class SharedCores:
    """Processor sharing among the ranks computing: ``run(work, ranks)`` is an event that fires when
    ``work`` seconds of compute are done at the rate the number computing allows."""

    def __init__(self, env: simpy.Environment, table: dict[int, float]):
        self.env, self.table = env, dict(table)
        self._jobs: list[list] = []  # [work left (s), ranks, event]
        self._since = 0.0  # when the work left was last brought up to date
        self._version = 0  # a reschedule makes every earlier wake-up stale
        self._rates: dict[int, float] = {}

    def computing(self) -> int:
        return sum(job[1] for job in self._jobs)

    def _rate(self) -> float:
        n = self.computing()
        if n not in self._rates:
            self._rates[n] = 1.0 / slowdown_at(self.table, n)
        return self._rates[n]

    def run(self, work: float, ranks: int = 1) -> simpy.Event:
        done = self.env.event()
        if work <= TOLERANCE:
            done.succeed()
            return done
        self._advance()
        self._jobs.append([work, ranks, done])
        self._reschedule()
        return done

    def _advance(self) -> None:
        elapsed, self._since = self.env.now - self._since, self.env.now
        if elapsed > 0 and self._jobs:
            progress = elapsed * self._rate()
            for job in self._jobs:
                job[0] -= progress

    def _reschedule(self) -> None:
        self._version += 1
        if self._jobs:
            wait = max(min(job[0] for job in self._jobs), 0.0) / self._rate()
            self.env.timeout(wait).callbacks.append(lambda _, version=self._version: self._finish(version))

    def _finish(self, version: int) -> None:
        if version != self._version:  # the set computing changed since: a later wake-up stands
            return
        self._advance()
        finished = [job for job in self._jobs if job[0] <= TOLERANCE]
        self._jobs = [job for job in self._jobs if job[0] > TOLERANCE]
        for job in finished:
            job[2].succeed()
        self._reschedule()
