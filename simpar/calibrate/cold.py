"""A unit that runs once a step finds the caches cold: what it pays grows with the time since the same kind
of unit last ran on the rank (docs/calibration.md, "Once-a-step units find the caches cold").

On the development VM the embedding's forward takes 20 us run twice in a row and 49 / 148 us right after
tiny's / tiny-deep's Adam step; 36 / 60 / 91 us after 0.5 / 2 / 5 ms of a bare Python loop that touches no
memory, and as much after as long a sleep: time away from the unit's code and data, not the bytes touched
in between (a sweep of 8 MB in 0.1 ms adds 9 us), cools them (other tenants share the caches). Inside the
executor's one-rank step the units that run once a micro-batch pay it by the step's length: tiny-deep's
embedding forward 169-177 us against tiny's 88-114 and its head 54-56 us more, with the same vocab, width
and sequence; tiny with 1 to 12 layers takes 84 -> 209 us for the embedding's forward, 117 -> 221 for the
head's, 167 -> 396 for the head's backward, its layers alike throughout. A layer's first op of a step pays
it too, but the other layers follow one another: its overhead keeps the mean (a cold term of its own fitted
below zero on these rows).

Priced as ``cold[kind] x (1 - exp(-gap / tau))`` for the embedding and the head, ``gap`` the time since the
rank last ran the same kind in the same phase; ``tau`` and ``cold`` are fitted with the units' other costs
(``fit_unit_costs``) on the calibration's one-rank steps, whose gaps are timed op by op.
"""

from __future__ import annotations

import math
from collections import defaultdict

COLD_KINDS = ("embedding", "head")  # the units a step runs once per micro-batch
TAUS = (1e-3, 2e-3, 3e-3, 5e-3, 8e-3, 12e-3, 20e-3)  # the decay times the fit tries, seconds


def cold_share(gaps: list[float], tau: float) -> float:
    """The mean share of the full cold cost that ops ``gaps`` seconds after the last of their kind pay."""
    if not gaps or tau <= 0:
        return 0.0
    return sum(1.0 - math.exp(-gap / tau) for gap in gaps) / len(gaps)


class GapClock:
    """The gaps of one rank's timed units, from its steps' timelines: for each (kind, phase) and each of its
    ops in a step's order, the seconds since the op before it of that kind and phase ended (the step before,
    for the step's first)."""

    def __init__(self):
        self._last: dict[tuple[str, str], float] = {}
        self._gaps: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))

    def add_step(self, units: list[tuple[str, str, float, float]], keep: bool) -> list[float | None]:
        """One step's units in order, as (kind, phase, start, end) on one clock; ``keep``: record its gaps.
        Returns each unit's gap (None for the first of its kind the clock sees)."""
        position: dict[tuple[str, str], int] = defaultdict(int)
        gaps = []
        for kind, phase, start, end in units:
            key = (kind, phase)
            gaps.append(start - self._last[key] if key in self._last else None)
            if keep and gaps[-1] is not None:
                self._gaps[key][position[key]].append(gaps[-1])
            position[key] += 1
            self._last[key] = end
        return gaps

    def gaps(self, kind: str, phase: str) -> list[float]:
        """The mean gap of each of the kind's ops in a step, in order (empty before two steps)."""
        by_position = self._gaps.get((kind, phase), {})
        return [sum(g) / len(g) for _, g in sorted(by_position.items())]
