"""A series of calls right after computing, call by call: what its first call pays beyond the calls
after it (``series_wake``), and how much less its later calls pay than its second to fourth
(``series_late``), from ``pattern_worker``'s timestamps.

Why the later calls: after a unit's compute the executor's small ring all-gathers at 2 ranks took, by
position in a series of ten (mean of 600 series, 4 KiB and 16 KiB alike, 2026-11-26): 1.2-1.3 ms,
1.1-1.2, 0.71-0.75, 0.64-0.71, then 0.49-0.62 from the fifth to the ninth, back to back 0.44-0.47 ms,
and the last (a compute follows it) 0.86-0.93 ms. The stalls of a just-woken rank (a call over 2 ms:
23 % of the second calls, 11 % of the third, 6-8 % from the fifth, 5 % back to back) thin out as the
series goes on. ``pattern_worker``'s rows of 1 and ``SERIES`` calls fit the step latency over the second
to fourth, the last included; ZeRO-3 gathers a layer's modules in series of 8-10 calls, whose fifth and
later calls the executor timed 0.46-0.70 ms where that latency priced 0.76-0.91 ms.
"""

from __future__ import annotations

import statistics

SERIES = 4  # calls in a row after one unit's compute in pattern_worker's rows (and 1): what the step latency is fitted on
SERIES_LONG = 10  # calls in the series timed call by call for ``series_late``


def _calls(marks: list[list[float]]) -> list[list[float]]:
    """Each rank's [compute end, each call's end] of one repetition -> the calls' times, averaged over the
    ranks position by position (the simulator's one compute end stands for theirs)."""
    return [statistics.fmean(m[i + 1] - m[i] for m in marks) for i in range(len(marks[0]) - 1)]


def series_wake(series_by_rank: list[list[list[float]]]) -> float:
    """What the first of a series of calls after computing pays beyond each call after it, from
    ``pattern_worker``'s timestamps (every rank's list of [compute end, each call's end], repetition by
    repetition): per repetition, the first call's time averaged over the ranks less the mean of the calls
    after it; the mean over repetitions. Paired inside each repetition, it does not move with the
    machine's drift, as the difference of a loop of 1 call and one of 4, taken seconds apart, did (0-1.9 ms
    at 2 ranks over six calibrations); it holds both the wait for the slowest rank and a slow first call."""
    extra = []
    for marks in zip(*series_by_rank):  # one repetition, every rank
        calls = _calls(list(marks))
        extra.append(calls[0] - statistics.fmean(calls[1:]))
    return max(statistics.fmean(extra), 0.0) if extra else 0.0


def series_late(series_by_rank: list[list[list[float]]]) -> float:
    """Seconds a call from the (``SERIES`` + 1)-th on of a series after computing pays beyond the step
    latency fitted on rows of ``SERIES`` calls (negative: less), from ``pattern_worker``'s series of
    ``SERIES_LONG`` calls timed call by call: the mean of the fifth to the last but one, less the mean of
    the second to fourth and a third of what the last pays beyond the one before it. The rows' fitted
    latency holds that third (their fourth call is their last, and a compute follows it), so a series of n
    calls is priced at the second to fourth's three, the last's extra once, and the later calls' level
    n - 4 times, as timed. The mean over repetitions (and ranks); 0 without series."""
    rows = [_calls(list(marks)) for marks in zip(*series_by_rank)]
    if not rows or len(rows[0]) < SERIES + 2:
        return 0.0
    per_position = [statistics.fmean(row[i] for row in rows) for i in range(len(rows[0]))]
    early = statistics.fmean(per_position[1:SERIES])
    late = statistics.fmean(per_position[SERIES:-1])
    last_extra = per_position[-1] - per_position[-2]
    return late - early - last_extra / (SERIES - 1)
