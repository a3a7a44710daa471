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
        assert series_level(positions, calls, world, alpha, rate, handling) == pytest.approx(
            sum(beyond) / 3 / (world - 1))
    assert series_level([1e-3] * 3, calls[:3], 2, alpha, rate, handling) == 0.0
    assert series_level([1e-3] * 8, calls[:7], 2, alpha, rate, handling) == 0.0


def test_zero3_gathers_from_the_second_of_a_series_pay_the_level_exactly():
    """Every ZeRO-3 parameter gather from the second of its series on pays ``series_level`` per ring step, and
    nothing else does: the step is longer by the level times their ring steps; the fast path equals the full
    simulation; a profile without it, or a 4-rank topology when it was measured at 2 alone, prices as before;
    ZeRO-2 (parameters kept whole) and DDP are priced the same with it."""
    from simpar.sim.op_costs import OpCosts

    scenario, plan = _zero3(2)
    level = 3e-4
    gathers, position = 0, 0  # parameter gathers from the second of a series of calls on
    for op in plan.programs[0].ops:
        position = 0 if isinstance(op, (Compute, Copy)) else position + isinstance(op, Collective)
        gathers += isinstance(op, Collective) and op.op == "allgather" and op.payload == "params" and position >= 2
    assert 0 < gathers <= sum(n - 1 for n in _series_lengths(plan.programs[0]))

    def topology(value, world=2):
        profile = _profile()
        profile.series_level = {"2": value} if value is not None else {}
        return profile.topology(world, "fp32")

    costs = OpCosts(plan, scenario, topology(level))
    assert sorted(set(costs.later_calls.values())) == [level]
    assert len([key for key in costs.later_calls if key[0] == 0]) == gathers
    assert not OpCosts(plan, scenario, topology(None)).later_calls
    before = simulate(scenario, topology=topology(None), serial=True).step_time_s
    after = simulate(scenario, topology=topology(level), serial=True).step_time_s
    assert after - before == pytest.approx(gathers * level, rel=1e-6)  # 2 ranks: one ring step a gather
    assert simulate(scenario, topology=topology(level), serial=True, replay=False).step_time_s == pytest.approx(
        after, rel=1e-12)
    assert topology(level, 4).series_level == 0.0
    for strategy in ("zero2", "ddp"):
        other = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, precision="fp32", topology="cpu-host")
        assert (simulate(other, topology=topology(level), serial=True).step_time_s
                == simulate(other, topology=topology(None), serial=True).step_time_s)
