"""ZeRO-3's module gathers from the second of a series on (``series_level``): fitted from the executor's own
series against a bare call's price, and what the simulator prices with it."""

import pytest

from simpar.models import model
from simpar.plan import Collective, Compute, Copy
from simpar.scenario import make_scenario
from simpar.sim import simulate
from tests.test_calibrate import _profile
from tests.test_series_late import _series_lengths, _zero3


def test_the_level_is_the_second_to_fourth_calls_beyond_a_bare_calls_price():
    """Eight calls timed by place; a bare call priced at 0.5 ms a ring step, 1 GB/s, 2 us a tensor and 1 ns an
    element of handling: the level is the mean over the second to fourth calls of what each took beyond its
    price, per ring step (3 of them at 4 ranks); fewer calls timed than shapes given, or too short a series:
    none."""
    from simpar.calibrate.series import series_level

    calls = [{"bytes": b, "tensors": t, "elements": b // 4} for b, t in
             ((512, 2), (512, 2), (16640, 2), (16640, 2), (16640, 2), (16640, 2), (66560, 2), (65792, 2))]
    alpha, rate, handling = 5e-4, 1e9, [2e-6, 1e-9]

    def price(call, world):
        return (world - 1) * (alpha + max(call["bytes"] // 4, world) * 4 / world / rate) + 2 * 2e-6 + call["elements"] * 1e-9

    for world, beyond in ((2, [3e-4, 1e-4, 2e-4]), (4, [9e-4, 3e-4, 6e-4])):
        positions = [2e-3] + [price(c, world) + e for c, e in zip(calls[1:4], beyond)] + [1e-3] * 4
        assert series_level([(positions, calls)], world, alpha, rate, handling) == pytest.approx(
            sum(beyond) / 3 / (world - 1))
    assert series_level([([1e-3] * 3, calls[:3])], 2, alpha, rate, handling) == 0.0
    assert series_level([([1e-3] * 8, calls[:7])], 2, alpha, rate, handling) == 0.0
    assert series_level([], 2, alpha, rate, handling) == 0.0


def test_the_level_pools_the_patterns_after_a_forward_and_after_a_backward():
    """``series_worker`` times a series after a forward (gathers only) and one after a backward (the layer's
    reduce-scatter, then gathers): the level is the mean over both patterns' second to fourth calls, each
    beyond its own price (the reduce-scatter's place is the backward's first, not among them); a pattern too
    short to have a fourth call adds nothing."""
    from simpar.calibrate.series import series_level

    gather = {"op": "allgather", "bytes": 16640, "tensors": 2, "elements": 4160}
    scatter = {"op": "reducescatter", "bytes": 199936, "tensors": 16, "elements": 49984}
    alpha, rate, handling = 5e-4, 1e9, [2e-6, 1e-9]
    price = alpha + 16640 / 2 / rate + 2 * 2e-6 + 4160 * 1e-9  # 2 ranks: one ring step of half the bytes
    forward = ([2e-3] + [price + 1e-4] * 3 + [1e-3] * 4, [gather] * 8)
    backward = ([3e-3] + [price + 3e-4] * 3 + [1e-3] * 5, [scatter] + [gather] * 8)
    assert series_level([forward], 2, alpha, rate, handling) == pytest.approx(1e-4)
    assert series_level([backward], 2, alpha, rate, handling) == pytest.approx(3e-4)
    assert series_level([forward, backward], 2, alpha, rate, handling) == pytest.approx(2e-4)
    assert series_level([forward, ([3e-3, price], [scatter, gather])], 2, alpha, rate, handling) == pytest.approx(
        1e-4)


def test_zero3_gathers_from_the_second_of_a_series_pay_the_level_exactly():
    """Every ZeRO-3 parameter gather from the second of its series on pays ``series_level`` per ring step, and
    nothing else does: the step is longer by the level times their ring steps; the fast path equals the full
    simulation; a profile without it, or a 4-rank topology when it was measured at 2 alone, prices as before;
    ZeRO-2 (parameters kept whole) and DDP are priced the same with it."""
    scenario, plan = _zero3(2)
    level = 3e-4
    gathers, position = 0, 0  # parameter gathers from the second of a series of calls on
    for op in plan.programs[0].ops:
        position = 0 if isinstance(op, (Compute, Copy)) else position + isinstance(op, Collective)
        gathers += isinstance(op, Collective) and op.op == "allgather" and op.payload == "params" and position >= 2
    assert 0 < gathers <= sum(n - 1 for n in _series_lengths(plan.programs[0]))

    assert_priced_per_gather("series_level", level, gathers)


def test_the_first_gather_is_a_point_of_the_wakes_share_beyond_its_price():
    """``series_first``: [the compute before the series, what its first gather took beyond its price (the ring's
    steps, its handling)]; nothing without a series, or with fewer calls timed than shapes given."""
    from simpar.calibrate.series import series_first

    calls = [{"bytes": 512, "tensors": 2, "elements": 128}, {"bytes": 16640, "tensors": 2, "elements": 4160}]
    alpha, rate, handling = 5e-4, 1e9, [2e-6, 1e-9]
    price = alpha + 512 / 2 / rate + 2 * 2e-6 + 128 * 1e-9  # 2 ranks: one ring step of half the bytes
    assert series_first([price + 3e-4, 1e-3], calls, 9e-4, 2, alpha, rate, handling) == pytest.approx([9e-4, 3e-4])
    assert series_first([price - 1e-4, 1e-3], calls, 9e-4, 2, alpha, rate, handling)[1] == pytest.approx(-1e-4)
    assert series_first([], calls, 9e-4, 2, alpha, rate, handling) == []
    assert series_first([1e-3], calls, 9e-4, 2, alpha, rate, handling) == []


def test_zero3_gathers_after_computing_take_their_share_through_their_own_point():
    """A ZeRO-3 parameter gather right after a compute pays the wake's share through ``series_first``'s point
    (its own series, after a layer-sized compute) instead of ``wake_short``'s; every other call after computing
    (its reduce-scatters, DDP's all-reduces) keeps ``wake_short``'s; the fast path equals the full simulation."""
    from simpar.sim.op_costs import OpCosts

    scenario, plan = _zero3(2)
    profile = _profile()
    profile.wake, profile.wake_phase = {"2": 1e-3}, {"2": 2e-3}
    profile.wake_short = {"2": [[0.5e-3, 0.5e-3]]}
    own = profile.topology(2, "fp32")
    assert own.gather_short is None
    profile.series_first = {"2": [0.5e-3, -0.2e-3]}
    topology = profile.topology(2, "fp32")
    assert topology.gather_short == ((0.5e-3, -0.2e-3),)
    costs, before = OpCosts(plan, scenario, topology), OpCosts(plan, scenario, own)
    ops = {op.id: op for op in plan.programs[0].ops}
    gathers = [key for key in costs.after_compute if key[0] == 0 and ops[key[1]].op == "allgather"]
    others = [key for key in costs.after_compute if key[0] == 0 and ops[key[1]].op != "allgather"]
    assert gathers and others
    for pi, op_id in gathers:
        phase = costs.after_compute[(pi, op_id)]
        assert costs.wake(pi, ops[op_id]) - before.wake(pi, ops[op_id]) == pytest.approx(
            1e-3 * (topology.wake_share(phase, ((0.5e-3, -0.2e-3),)) - topology.wake_share(phase)), abs=1e-12)
    assert any(costs.wake(0, ops[key[1]]) < before.wake(0, ops[key[1]]) for key in gathers)
    assert all(costs.wake(0, ops[key[1]]) == before.wake(0, ops[key[1]]) for key in others)
    full = simulate(scenario, topology=topology, serial=True, replay=False).step_time_s
    assert simulate(scenario, topology=topology, serial=True, fast=True).step_time_s == pytest.approx(full, rel=1e-9)
    assert full < simulate(scenario, topology=own, serial=True, replay=False).step_time_s
    ddp = make_scenario(model("tiny-deep"), "ddp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    assert (simulate(ddp, topology=topology, serial=True).step_time_s
            == simulate(ddp, topology=own, serial=True).step_time_s)


def test_the_compute_before_a_call_holds_the_executors_work_since_the_last_call_only():
    """The executor's work between ops is priced in the compute after them, but the phase a call's wake is
    priced after (``OpCosts.after_compute``) holds only the work of the ops since the last call: in ZeRO-3 the
    work before each gather of a series went between calls. With the work at ``b`` an op, each call's phase
    grows by ``b`` times the ops since the call before it, fewer than the ops since the compute before that."""
    from simpar.plan import Alloc, Free, Recv, Send
    from simpar.sim.op_costs import OpCosts

    scenario, plan = _zero3(2)
    profile = _profile()
    profile.wake, profile.wake_phase, profile.wake_short = {"2": 1e-3}, {"2": 2e-3}, {"2": [[0.5e-3, 0.5e-3]]}
    phases = []
    for work in (0.0, 1e-5):
        profile.between_ops = work
        phases.append(OpCosts(plan, scenario, profile.topology(2, "fp32")).after_compute)
    ops = plan.programs[0].ops
    checked = 0
    for i, op in enumerate(ops):
        if (0, op.id) not in phases[0]:
            continue
        compute = max((j for j in range(i) if isinstance(ops[j], Compute)), default=None)
        if compute is None:
            continue  # the step's first gather: its compute is the previous step's optimizer (tested apart)
        before = [j for j in range(compute) if not isinstance(ops[j], (Alloc, Free))]
        last_call = max((j for j in before if isinstance(ops[j], (Collective, Send, Recv))), default=None)
        last_compute = max((j for j in before if isinstance(ops[j], (Compute, Copy))), default=None)
        if last_call is None or last_compute is None or last_call < last_compute:
            continue  # the step's first (its phase runs round the step) or one without a call before its compute
        quiet, since = compute - last_call, compute - last_compute
        assert quiet < since
        assert phases[1][(0, op.id)] - phases[0][(0, op.id)] == pytest.approx(1e-5 * quiet, rel=1e-9)
        checked += 1
    assert checked > 5


def test_the_steps_first_gather_wakes_after_the_previous_steps_optimizer():
    """A step's first ZeRO-3 gather comes, in a run of many steps, right after the previous step's optimizer: it
    pays the wake after that compute (the phase round the step), as the executor's did (priced without it, 27-42 %
    short at the ordinary policy and 80 % at SCHED_BATCH: docs/calibration.md, forty-fifth stop)."""
    from simpar.sim.op_costs import OpCosts

    scenario, plan = _zero3(2)
    profile = _profile()
    profile.wake, profile.wake_phase, profile.wake_short = {"2": 1e-3}, {"2": 2e-3}, {"2": [[0.5e-3, 0.5e-3]]}
    costs = OpCosts(plan, scenario, profile.topology(2, "fp32"))
    prog = plan.programs[0]
    first = next(op for op in prog.ops if isinstance(op, Collective))
    assert not any(isinstance(op, Compute) for op in prog.ops[:prog.ops.index(first)])
    optimizer = [op for op in prog.ops if isinstance(op, Compute)][-1]
    assert optimizer.phase == "step"
    phase = costs.compute_time(prog, optimizer) * costs._all_at_once()
    assert costs.after_compute[(0, first.id)] == pytest.approx(phase, rel=1e-9)
    assert costs.wake(0, first) == pytest.approx(costs.topology.collective_wake(phase) + costs.handling(first))


def assert_priced_per_gather(name: str, value: float, gathers: int) -> None:
    """The profile's ``name`` (a per-ring-step term for some of ZeRO-3's parameter gathers, measured at 2 ranks)
    set to ``value`` is paid by exactly ``gathers`` calls of tiny-deep's 2-rank ZeRO-3 program and by no other
    call: the step is longer by ``gathers * value`` (one ring step a gather); the fast path equals the full
    simulation; a profile without it, or a 4-rank topology, prices as before; ZeRO-2 (parameters kept whole)
    and DDP are priced the same with it."""
    from simpar.sim.op_costs import OpCosts

    scenario, plan = _zero3(2)

    def topology(term, world=2):
        profile = _profile()
        setattr(profile, name, {"2": term} if term is not None else {})
        return profile.topology(world, "fp32")

    costs = OpCosts(plan, scenario, topology(value))
    assert sorted(set(costs.later_calls.values())) == [value]
    assert len([key for key in costs.later_calls if key[0] == 0]) == gathers
    assert not OpCosts(plan, scenario, topology(None)).later_calls
    before = simulate(scenario, topology=topology(None), serial=True).step_time_s
    after = simulate(scenario, topology=topology(value), serial=True).step_time_s
    assert after - before == pytest.approx(gathers * value, rel=1e-6)
    assert simulate(scenario, topology=topology(value), serial=True, replay=False).step_time_s == pytest.approx(
        after, rel=1e-12)
    assert getattr(topology(value, 4), name) == 0.0
    for strategy in ("zero2", "ddp"):
        other = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, precision="fp32", topology="cpu-host")
        assert (simulate(other, topology=topology(value), serial=True).step_time_s
                == simulate(other, topology=topology(None), serial=True).step_time_s)
