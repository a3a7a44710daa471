"""A long accumulation priced from two short ones.

Once a pipeline is full, each micro-batch more adds the same forward and backward on every stage and
changes nothing else (warm-up, drain and the final reduction stay as they were), so a step is affine in
the number of micro-batches m: simulated at the pipeline's depth p and one period more (p + 1; for the
interleaved schedule, whose period is p, from where its warm-up's memory stops growing: ``points_for``;
1 and 2 without a pipeline; ZB-H1 like 1F1B; ZB-V, list-scheduled, is simulated whole), everything the simulator reports (step time, breakdown, bytes, memory peaks)
follows at any m. ``tests/test_fast_path.py`` holds it to the fast path's whole step.
"""

from __future__ import annotations

from dataclasses import replace

from simpar.scenario import Scenario


def extrapolation_points(m: int, base: int, period: int = 1) -> list[int]:
    """Micro-batch counts to simulate for a step of ``m``: ``base`` (the pipeline's depth, 1 without
    one; by then every stage is busy) and one ``period`` more, or m itself when that is no longer."""
    return [base, base + period] if m > base + period else [m]


def extrapolate(times: list[float], points: list[int], m: int) -> float:
    """The value at ``m`` micro-batches from its values at ``points`` (affine in m)."""
    if len(times) == 1:
        return times[0]
    return times[1] + (m - points[1]) * (times[1] - times[0]) / (points[1] - points[0])


def points_for(scenario: Scenario) -> list[int]:
    """The two micro-batch counts ``simulate(extrapolate=True)`` prices a step from: the pipeline's depth and one
    more (1F1B: by then every stage holds its most micro-batches; GPipe's activations grow with m, affine too);
    the interleaved schedule's warm-up holds up to 2 (p - 1) + (v - 1) p micro-batches, so its points start at
    (v + 1) p, a multiple of its period p, where the memory peaks no longer grow."""
    spec = scenario.strategy
    if spec.schedule == "zb-v":  # its list-scheduled order has no period to carry: simulated whole
        return [scenario.microbatches]
    if spec.schedule == "interleaved":
        return extrapolation_points(scenario.microbatches, (spec.virtual_stages + 1) * spec.pp, spec.pp)
    return extrapolation_points(scenario.microbatches, spec.pp, 1)


def with_microbatches(scenario: Scenario, m: int) -> Scenario:
    """``scenario`` with ``m`` micro-batches a step, all else the same."""
    batch = scenario.train.micro_batch * scenario.strategy.dp * m
    return replace(scenario, train=replace(scenario.train, global_batch=batch))


def affine(values: list, points: list[int], m: int, memo: dict | None = None):
    """Two results of the same shape (numbers, dicts, lists of them) carried to ``m`` number by number; an
    integer stays an integer (bytes), anything else is the last point's (names, timelines). A part the results
    share between ranks (a program's breakdown and memory) is carried once, and shared again."""
    first, last = values
    if isinstance(last, bool) or not isinstance(last, (int, float, dict, list)):
        return last
    if isinstance(last, (dict, list)):
        memo = {} if memo is None else memo
        key = (id(first), id(last))
        if key not in memo:
            if isinstance(last, dict):
                memo[key] = {k: affine([first[k], v], points, m, memo) if k in first else v for k, v in last.items()}
            else:
                memo[key] = [affine([a, b], points, m, memo) for a, b in zip(first, last)] \
                    if len(first) == len(last) else last
        return memo[key]
    value = extrapolate([first, last], points, m)
    return round(value) if isinstance(last, int) else value
