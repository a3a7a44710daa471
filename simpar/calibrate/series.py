"""A series of calls right after computing, call by call: what its first call pays beyond the calls
after it (``series_wake``), and how much less its later calls pay than its second to fourth
(``series_late``), and how much more its last, before the compute after it (``series_last``), from
timestamps taken around each call.

Why the later calls: ``pattern_worker``'s rows of 1 and ``SERIES`` calls after a unit's compute fit the
step latency on a series' second to fourth calls, and ZeRO-3 gathers a layer's modules in series of 8-10
calls, whose later calls stall less (benchmarks/series_positions.py). At 2 ranks on the development VM
(2026-11-26), the executor's own ZeRO-3 step timed its fifth to eighth calls of a series 0.09-0.20 ms
below its second to fourth (six runs), where the step latency priced them alike. Bare ring all-gathers
in a row (``CountingComm`` alone) drop by 0.22-0.49 ms instead: the executor's own work around each call
(20 us of it, ``ModelStates`` handing the gathered modules back) leaves the ranks out of step, so more
receives block and wait to be woken. So the series is timed through the executor's own code
(``series_worker``: its ZeRO-3 gathers of a layer's modules, 0.50-0.69 ms later against 0.40-0.57 bare).
"""

from __future__ import annotations

import statistics
import time

from simpar.calibrate.fits import ring_price, ring_steps

SERIES = 4  # calls in a row after a unit's compute in pattern_worker's rows (and 1): the step latency's fit
SERIES_SECONDS = 6.0  # how long series_worker times its series (at the default repeats)
SERIES_COMPUTE = 8e-4  # seconds (alone) of the products before each of series_worker's series: a layer's piece


def _calls(marks: list[list[float]]) -> list[float]:
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


def series_positions(series_by_rank: list[list[list[float]]]) -> list[float]:
    """The mean time of each call of a series by its position (per repetition the ranks' mean, then the
    repetitions'), from every rank's [compute end, each call's end] per repetition; [] without any."""
    rows = [_calls(list(marks)) for marks in zip(*series_by_rank)]
    return [statistics.fmean(row[i] for row in rows) for i in range(len(rows[0]))] if rows else []


def series_late(series_by_rank: list[list[list[float]]]) -> float:
    """Seconds a call from the (``SERIES`` + 1)-th on of a series after computing pays beyond its second to
    fourth (negative: less), from every rank's [compute end, each call's end] per repetition: per
    repetition (the ranks' mean) the fifth to the last but one calls' mean (the last pays for the compute
    that follows it, as the rows' fourth did: ``series_last``) less the second to fourth's; their mean over
    repetitions, 0 where it lies within twice its standard error of 0 (at 8 ranks on 2 cores a call takes
    20-29 ms, and 40 repetitions cannot tell a fraction of a millisecond) or the series is too short."""
    return _paired(series_by_rank, lambda row: statistics.fmean(row[SERIES:-1]) - statistics.fmean(row[1:SERIES]))


def series_last(series_by_rank: list[list[list[float]]]) -> float:
    """Seconds the last call of a series, the one a compute follows, pays beyond the (``SERIES`` + 1)-th to
    the last but one, from the same timestamps as ``series_late`` and tested the same way. A rank's last call
    still needs its peer's part of the exchange after the peer's own call has returned, and the peer is
    computing by then: with the compute after the series replaced by a sleep as long the last call cost what
    the calls before it did (-0.03 to 0.00 ms, three launches), with the product burst +0.09 to +0.15 ms more;
    the calibrations' series of the thirtieth to thirty-second stops +0.12 to +0.39 ms, the executor's ZeRO-3
    step +0.11 to +0.40 ms at 2 ranks (``benchmarks/series_last_call.py``; docs/calibration.md)."""
    return _paired(series_by_rank, lambda row: row[-1] - statistics.fmean(row[SERIES:-1]))


def _paired(series_by_rank: list[list[list[float]]], difference) -> float:
    """``difference(calls)`` per repetition (each call's time, the ranks' mean), averaged over the repetitions;
    0 where that lies within twice its standard error of 0, or with under two repetitions or a series too short
    to have calls from the (``SERIES`` + 1)-th to the last but one."""
    rows = [_calls(list(marks)) for marks in zip(*series_by_rank)]
    if len(rows) < 2 or len(rows[0]) < SERIES + 2:
        return 0.0
    drops = [difference(row) for row in rows]
    mean, error = statistics.fmean(drops), statistics.stdev(drops) / len(drops) ** 0.5
    return mean if abs(mean) > 2 * error else 0.0


def timed_series(compute, calls: list, seconds: float, after=None) -> list[list[float]]:
    """``compute()``, then each of ``calls`` in a row, every rank at once, ten repetitions between barriers,
    until ``seconds`` have passed (rank 0 decides, so every rank stops together); ``after()`` once each
    repetition, untimed. Per repetition [compute end, each call's end], clock times."""
    import torch
    import torch.distributed as dist

    marks, began, more = [], time.perf_counter(), torch.ones(1)
    while more.item():
        dist.barrier()
        for _ in range(10):
            compute()
            ends = [time.perf_counter()]
            for call in calls:
                call()
                ends.append(time.perf_counter())
            marks.append(ends)
            if after is not None:
                after()
        more.fill_(float(time.perf_counter() - began < seconds))
        dist.broadcast(more, 0)
    return marks


def series_worker(ctx, seconds: float = SERIES_SECONDS, precision: str = "fp32") -> dict:
    """The executor's own series: tiny-deep under ZeRO-3 on ``ctx.world`` ranks at ``precision`` (the profile's;
    until the forty-ninth stop an fp32 profile timed bf16-mixed gathers, the scenario's default), ``RankExecutor``
    after three steps: a compute of about a layer's piece (``SERIES_COMPUTE`` of small products), then the
    gathers that come before the third layer's forward (the next layer's modules, gathered ahead), each through
    the executor's own collective code, every rank at once, repeated (the modules released again after each)
    until ``seconds`` have passed. {"series": [[compute end, each call's end] per repetition, clock times],
    "compute": mean seconds of the compute before each}. A ZeRO-3 step's series follow a layer's forward or
    backward (0.6-0.9 ms each at 2 ranks in the executor's step), not a unit's forward and backward: after the
    unit (2 ms) the series' first gather took 1.34-1.36 ms and its second to fourth 0.69-0.73; after 0.8 ms of
    compute 0.67-0.74 and 0.58-0.63; in the executor's step (40 steps, per op) 0.79 and 0.58 (2 ranks,
    2026-11-27)."""
    from simpar.calibrate.bench import _short_burst
    from simpar.models import model
    from simpar.plan import Collective, Compute
    from simpar.real.executor import RankExecutor
    from simpar.scenario import make_scenario

    scenario = make_scenario(model("tiny-deep"), "zero3", ctx.world, micro_batch=2, topology="cpu-host",
                             precision=precision)
    executor = RankExecutor(ctx, scenario, seed=0)
    try:
        for step in range(3):
            executor.step(step)
        ops = executor.program.ops
        layer = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.unit == 3 and op.phase == "fwd")
        start = max(i for i, op in enumerate(ops[:layer]) if isinstance(op, Compute))
        gathers = [op for op in ops[start:layer] if isinstance(op, Collective)]
        burst, took = _short_burst(SERIES_COMPUTE), []

        def compute():
            began = time.perf_counter()
            burst()
            took.append(time.perf_counter() - began)

        def release():
            for op in gathers:
                executor.states.release_module(op.units[0], op.modules[0])

        marks = timed_series(compute, [lambda op=op: executor._collective(op) for op in gathers], seconds, release)
    finally:
        executor.states.close()
    return {"series": marks, "calls": [gather_shape(scenario.model, op) for op in gathers],
            "compute": statistics.fmean(took)}


def gather_shape(spec, op) -> dict:
    """What prices one of the series' gathers: its bytes, and the parameter tensors and elements the executor
    hands back (``OpCosts.handling``'s count of them)."""
    from simpar.sim.op_costs import moved_tensors

    return {"bytes": op.nbytes, "tensors": moved_tensors(spec, op), "elements": op.nbytes // op.itemsize}


def beyond_price(seconds: float, call: dict, world: int, alpha: float, bytes_per_s: float,
                 handling: list[float]) -> float:
    """Seconds a gather of the series (``call``: ``gather_shape``) took beyond what the simulator prices it at:
    the ring's step latency and bandwidth, and the executor's handling of its data (per tensor, per element)."""
    per_tensor, per_element = handling or (0.0, 0.0)
    return (seconds - ring_price("allgather", call["bytes"], world, alpha, bytes_per_s)
            - per_tensor * call["tensors"] - per_element * call["elements"])


def series_first(positions: list[float], calls: list[dict], compute: float, world: int, alpha: float,
                 bytes_per_s: float, handling: list[float]) -> list[float]:
    """[seconds of the compute before the series, what its first gather cost beyond its price]: a point of the
    wake's share for ZeRO-3's gathers (``Topology.gather_short``); [] without a series."""
    if not positions or len(calls) != len(positions):
        return []
    return [compute, beyond_price(positions[0], calls[0], world, alpha, bytes_per_s, handling)]


def series_level(positions: list[float], calls: list[dict], world: int, alpha: float, bytes_per_s: float,
                 handling: list[float]) -> float:
    """Seconds per ring step the executor's own ZeRO-3 gathers pay, from the second of a series on, beyond
    what the simulator prices a call at (the ring's step latency ``alpha`` and bandwidth, fitted on
    ``pattern_worker``'s bare calls, and the executor's handling of the data, ``handling`` = [per tensor,
    per element]): the mean over the series' second to ``SERIES``-th calls (``positions``, the calls' mean
    times by place; ``calls``, their shapes, ``gather_shape``). The executor's module gathers leave the ranks
    out of step (``ModelStates`` hands each module back between calls), so more receives block and wait to
    be woken than in a bare series: at 2 ranks on the development VM the second to fourth calls took 0.68-0.89
    ms where the bare rows priced 0.51-0.77 (2026-11-26). 0 without a series (ranks outnumbering the cores)."""
    if len(positions) < SERIES or len(calls) != len(positions):
        return 0.0
    beyond = [beyond_price(t, call, world, alpha, bytes_per_s, handling)
              for t, call in zip(positions[1:SERIES], calls[1:SERIES])]
    return statistics.fmean(beyond) / ring_steps("allgather", world)
