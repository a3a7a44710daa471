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
WARM_STEPS = 5  # the executor's steps series_worker runs first: its bursts are the layers' compute in them


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


def series_late(*patterns: list[list[list[float]]]) -> float:
    """Seconds a call from the (``SERIES`` + 1)-th on of a series after computing pays beyond its second to
    fourth (negative: less), from every rank's [compute end, each call's end] per repetition (of each pattern
    timed: ``series_worker``'s after a forward and after a backward, pooled): per repetition (the ranks' mean)
    the fifth to the last but one calls' mean (the last pays for the compute that follows it, as the rows'
    fourth did: ``series_last``) less the second to fourth's; their mean over repetitions, 0 where it lies
    within twice its standard error of 0 (at 8 ranks on 2 cores a call takes 20-29 ms, and 40 repetitions
    cannot tell a fraction of a millisecond) or the series is too short."""
    return _paired(patterns, lambda row: statistics.fmean(row[SERIES:-1]) - statistics.fmean(row[1:SERIES]))


def series_last(*patterns: list[list[list[float]]]) -> float:
    """Seconds the last call of a series, the one a compute follows, pays beyond the (``SERIES`` + 1)-th to
    the last but one, from the same timestamps as ``series_late`` and tested the same way. A rank's last call
    still needs its peer's part of the exchange after the peer's own call has returned, and the peer is
    computing by then: with the compute after the series replaced by a sleep as long the last call cost what
    the calls before it did (-0.03 to 0.00 ms, three launches), with the product burst +0.09 to +0.15 ms more;
    the calibrations' series of the thirtieth to thirty-second stops +0.12 to +0.39 ms, the executor's ZeRO-3
    step +0.11 to +0.40 ms at 2 ranks (``benchmarks/series_last_call.py``; docs/calibration.md)."""
    return _paired(patterns, lambda row: row[-1] - statistics.fmean(row[SERIES:-1]))


def _paired(patterns, difference) -> float:
    """``difference(calls)`` per repetition (each call's time, the ranks' mean) of every pattern, averaged over
    all their repetitions; 0 where that lies within twice its standard error of 0, or with under two
    repetitions or a series too short to have calls from the (``SERIES`` + 1)-th to the last but one."""
    rows = [_calls(list(marks)) for series_by_rank in patterns for marks in zip(*series_by_rank)]
    rows = [row for row in rows if len(row) >= SERIES + 2]
    if len(rows) < 2:
        return 0.0
    drops = [difference(row) for row in rows]
    mean, error = statistics.fmean(drops), statistics.stdev(drops) / len(drops) ** 0.5
    return mean if abs(mean) > 2 * error else 0.0


def timed_series(compute, calls: list, seconds: float, after=None) -> list[list[float]]:
    """``compute()``, then each of ``calls`` in a row, every rank at once, ten repetitions between barriers,
    until ``seconds`` have passed (rank 0 decides, so every rank stops together); ``after()`` once each
    repetition, untimed. Per repetition [compute end, each call's end], clock times."""
    return timed_patterns([(None, compute, calls, after)], seconds)[0]


def timed_patterns(patterns: list, seconds: float) -> list[list[list[float]]]:
    """``timed_series`` of several patterns in turn, each repetition all of them one after the other, so that
    each is timed in the same stretch of the machine's drift: ``patterns`` [(before, compute, calls, after)],
    ``before()`` and ``after()`` untimed (None: nothing). Per pattern, per repetition [compute end, each
    call's end], clock times."""
    import torch
    import torch.distributed as dist

    marks, began, more = [[] for _ in patterns], time.perf_counter(), torch.ones(1)
    while more.item():
        dist.barrier()
        for _ in range(10):
            for timed, (before, compute, calls, after) in zip(marks, patterns):
                if before is not None:
                    before()
                compute()
                ends = [time.perf_counter()]
                for call in calls:
                    call()
                    ends.append(time.perf_counter())
                timed.append(ends)
                if after is not None:
                    after()
        more.fill_(float(time.perf_counter() - began < seconds))
        dist.broadcast(more, 0)
    return marks


def series_scenario(world: int, precision: str):
    """The scenario ``series_worker`` runs: tiny-deep under ZeRO-3 on ``world`` ranks at ``precision``."""
    from simpar.models import model
    from simpar.scenario import make_scenario

    return make_scenario(model("tiny-deep"), "zero3", world, micro_batch=2, topology="cpu-host", precision=precision)


def calls_after(ops: list, unit: int, phase: str) -> list:
    """The collectives of a program's ``ops`` between the compute of ``unit``'s ``phase`` and the compute after it:
    ``series_worker``'s after a forward (unit 2's: unit 4's modules, gathered two units ahead) and after a
    backward (unit 5's: its reduce-scatter, then unit 3's gathers)."""
    from simpar.plan import Collective, Compute

    computes = [i for i, op in enumerate(ops) if isinstance(op, Compute)]
    at = next(i for i in computes if ops[i].unit == unit and ops[i].phase == phase)
    end = next((i for i in computes if i > at), len(ops))
    return [op for op in ops[at:end] if isinstance(op, Collective)]


AFTER_FORWARD, AFTER_BACKWARD = (2, "fwd"), (5, "bwd")  # the computes series_worker's two patterns follow


def series_worker(ctx, seconds: float = SERIES_SECONDS, precision: str = "fp32") -> dict:
    """The executor's own series: tiny-deep under ZeRO-3 on ``ctx.world`` ranks at ``precision`` (the profile's;
    until the forty-ninth stop an fp32 profile timed bf16-mixed gathers, the scenario's default), ``RankExecutor``
    after ``WARM_STEPS`` steps, two patterns in turn, each through the executor's own collective code, every rank
    at once, repeated until ``seconds`` have passed: after a forward, a burst of small products as long as a
    layer's forward took in those steps (all but the first), then the gathers that come after the second layer's
    forward (unit 4's modules, gathered two units ahead); after a backward, a burst as long as a layer's backward
    took, then the layer's reduce-scatter of its gradients (coalesced by module) and the gathers that follow it
    in the step (an earlier layer's modules, in reverse). The modules are released again after each, the
    gradients given back before each backward's. {"series": [[compute end, each call's end] per repetition,
    clock times] after the forward, "series_bwd" after the backward, "calls" and "calls_bwd" their shapes
    (``gather_shape``), "compute" and "compute_bwd" the mean seconds of the burst before each}. A ZeRO-3 step's
    series follow a layer's forward or backward, not a unit's forward and backward: after the unit (2 ms) the
    series' first gather took 1.34-1.36 ms and its second to fourth 0.69-0.73; after 0.8 ms of compute
    0.67-0.74 and 0.58-0.63; in the executor's step (40 steps, per op) 0.79 and 0.58 (2 ranks, 2026-11-27).
    Until the fiftieth stop the series came after 0.8 ms of products and after a forward only: the step's
    reduce-scatter had been priced 15-37 % under and the gathers after it cost about 10 % more than the
    forward's (docs/calibration.md, fiftieth stop)."""
    import torch

    from simpar.calibrate.bench import _short_burst
    from simpar.plan import Compute
    from simpar.real.executor import RankExecutor

    scenario = series_scenario(ctx.world, precision)
    executor = RankExecutor(ctx, scenario, seed=0)
    states = executor.states
    try:
        for step in range(WARM_STEPS):
            executor.step(step)
        ops = executor.program.ops
        forward, backward = calls_after(ops, *AFTER_FORWARD), calls_after(ops, *AFTER_BACKWARD)
        # each pattern's burst as long as a layer's forward or backward took in those steps (all but the first)
        took_in_steps = executor.recorder.op_means()
        layer = {phase: statistics.fmean(took_in_steps[op.id] for op in ops if isinstance(op, Compute)
                                         and op.phase == phase and scenario.model.unit_kind(op.unit) == "layer")
                 for phase in ("fwd", "bwd")}
        scatter = backward[0]
        grads = [p for u in scatter.units for p in states.unit_params[u]]
        dtype = grads[0].dtype
        took = {"fwd": [], "bwd": []}

        def timed_burst(kind: str, seconds: float):
            burst = _short_burst(seconds)

            def compute():
                began = time.perf_counter()
                burst()
                took[kind].append(time.perf_counter() - began)
            return compute

        def release(calls: list):
            for op in calls:
                if op.op == "allgather":
                    states.release_module(op.units[0], op.modules[0])

        def give_gradients():  # the layer's backward leaves them whole, its parameters gathered
            for p in grads:
                p.data = torch.empty(states.shapes[id(p)], dtype=dtype)
                p.grad = torch.ones(states.shapes[id(p)], dtype=dtype)

        def after_backward():
            release(backward[1:])
            states.shard_grads.pop(scatter.units, None)
            for p in grads:
                p.data = torch.empty(0, dtype=dtype)

        def run(calls: list) -> list:
            return [lambda op=op: executor._collective(op) for op in calls]

        after_forward, after_scatter = timed_patterns(
            [(None, timed_burst("fwd", layer["fwd"]), run(forward), lambda: release(forward)),
             (give_gradients, timed_burst("bwd", layer["bwd"]), run(backward), after_backward)], seconds)
    finally:
        states.close()
    return {"series": after_forward, "series_bwd": after_scatter,
            "calls": [gather_shape(scenario.model, op) for op in forward],
            "calls_bwd": [gather_shape(scenario.model, op) for op in backward],
            "compute": statistics.fmean(took["fwd"]), "compute_bwd": statistics.fmean(took["bwd"])}


def gather_shape(spec, op) -> dict:
    """What prices one of the series' calls: its collective, its bytes, and the tensors and elements the
    executor hands back or concatenates (``OpCosts.handling``'s count of them)."""
    from simpar.sim.op_costs import moved_tensors

    return {"op": op.op, "bytes": op.nbytes, "tensors": moved_tensors(spec, op), "elements": op.nbytes // op.itemsize}


def beyond_price(seconds: float, call: dict, world: int, alpha: float, bytes_per_s: float,
                 handling: list[float]) -> float:
    """Seconds a call of the series (``call``: ``gather_shape``; an all-gather where older samples do not say)
    took beyond what the simulator prices it at: the ring's step latency and bandwidth, and the executor's
    handling of its data (per tensor, per element)."""
    per_tensor, per_element = handling or (0.0, 0.0)
    return (seconds - ring_price(call.get("op", "allgather"), call["bytes"], world, alpha, bytes_per_s)
            - per_tensor * call["tensors"] - per_element * call["elements"])


def series_first(positions: list[float], calls: list[dict], compute: float, world: int, alpha: float,
                 bytes_per_s: float, handling: list[float]) -> list[float]:
    """[seconds of the compute before the series, what its first gather cost beyond its price]: a point of the
    wake's share for ZeRO-3's gathers (``Topology.gather_short``); [] without a series."""
    if not positions or len(calls) != len(positions):
        return []
    return [compute, beyond_price(positions[0], calls[0], world, alpha, bytes_per_s, handling)]


def series_level(patterns: list[tuple[list[float], list[dict]]], world: int, alpha: float, bytes_per_s: float,
                 handling: list[float]) -> float:
    """Seconds per ring step the executor's own ZeRO-3 gathers pay, from the second of a series on, beyond
    what the simulator prices a call at (the ring's step latency ``alpha`` and bandwidth, fitted on
    ``pattern_worker``'s bare calls, and the executor's handling of the data, ``handling`` = [per tensor,
    per element]): the mean over the second to ``SERIES``-th calls of each pattern timed (``patterns``: per
    pattern the calls' mean times by place and their shapes, ``gather_shape``; after a forward and after a
    backward, where the second to fourth are the gathers after the layer's reduce-scatter). The executor's
    module gathers leave the ranks out of step (``ModelStates`` hands each module back between calls), so
    more receives block and wait to be woken than in a bare series: at 2 ranks on the development VM the
    second to fourth calls took 0.68-0.89 ms where the bare rows priced 0.51-0.77 (2026-11-26). 0 without a
    series (ranks outnumbering the cores)."""
    beyond = [beyond_price(t, call, world, alpha, bytes_per_s, handling)
              for positions, calls in patterns if len(positions) >= SERIES and len(calls) == len(positions)
              for t, call in zip(positions[1:SERIES], calls[1:SERIES])]
    return statistics.fmean(beyond) / ring_steps("allgather", world) if beyond else 0.0


def scatter_level(profile, world: int, precision: str, seconds: float, compute: float) -> float:
    """Seconds per ring step the executor's reduce-scatter of a layer's gradients (ZeRO-3's, coalesced by
    module) pays after a backward beyond what the simulator prices it at after ``compute`` seconds of compute
    on ``profile`` (the wake there, its later steps, the executor's handling of the gradients, the ring's step
    latency and bandwidth): ``seconds``, its mean time in ``series_worker``'s backward pattern. The executor's
    call concatenates the layer's gradients, runs one ring over its modules' pieces and drops the gradients:
    at 2 ranks on the development VM 1.8-2.1 ms after 0.8 ms of compute, where the same coalesced ring bare
    took 1.3-1.4 ms and the simulator priced the step's 1.28-1.77 (2026-12-01)."""
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    scenario = series_scenario(world, precision)
    plan = build_plan(scenario)
    topology = profile.topology(world, precision)
    costs = OpCosts(plan, scenario, topology)
    op = calls_after(plan.programs[0].ops, *AFTER_BACKWARD)[0]
    alpha, bytes_per_s = profile.ring[str(world)]
    price = (topology.collective_wake(compute) + costs.later_steps(op, compute) + costs.handling(op)
             + ring_price("reducescatter", op.nbytes, world, alpha, bytes_per_s))
    return (seconds - price) / ring_steps("reducescatter", world)
