"""The later calls of a series after computing (``series_late``): what the simulator prices with them."""

import pytest

from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate
from tests.test_calibrate import _profile


def _zero3(world: int):
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny-deep"), "zero3", world, micro_batch=2, precision="fp32", topology="cpu-host")
    return scenario, build_plan(scenario)


def _series_lengths(prog) -> list[int]:
    """The lengths of the runs of network ops between computes (copies) in a program, allocations aside."""
    from simpar.plan import Collective, Compute, Copy, Recv, Send

    runs, run = [], 0
    for op in prog.ops:
        if isinstance(op, (Compute, Copy)):
            runs, run = runs + [run] * bool(run), 0
        elif isinstance(op, (Collective, Send, Recv)):
            run += 1
    return runs + [run] * bool(run)


def test_the_fifth_and_later_calls_of_a_series_pay_the_measured_shift_per_ring_step():
    """ZeRO-3 gathers a layer's modules in series of 8-10 calls: with ``series_late`` each call from the
    fifth on pays that much per ring step more (here less), exactly, and no other call does; the step is
    shorter by the sum; replaying a call equals simulating it; a profile without the field prices as
    before; DDP, whose calls never come five in a row, is priced the same."""
    from simpar.sim.op_costs import OpCosts

    for world, shift in ((2, -2e-5), (4, -2e-4)):  # less than the profile's step latency (50 us, 1 ms)
        scenario, plan = _zero3(world)
        lengths = _series_lengths(plan.programs[0])
        later = sum(max(n - 4, 0) for n in lengths)
        assert max(lengths) >= 8 and later > 0

        def topology(late):
            profile = _profile()
            profile.series_late = {str(world): late} if late is not None else {}
            return profile.topology(world, "fp32")

        costs = OpCosts(plan, scenario, topology(shift))
        assert sorted(set(costs.later_calls.values())) == [shift]
        assert len([key for key in costs.later_calls if key[0] == 0]) == later
        assert not OpCosts(plan, scenario, topology(None)).later_calls
        before = simulate(scenario, topology=topology(None), serial=True).step_time_s
        after = simulate(scenario, topology=topology(shift), serial=True).step_time_s
        assert after - before == pytest.approx(later * (world - 1) * shift, rel=1e-6)  # gathers of world - 1 steps
        again = simulate(scenario, topology=topology(shift), serial=True, replay=False).step_time_s
        assert again == pytest.approx(after, rel=1e-12)
    ddp = make_scenario(model("tiny-deep"), "ddp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    profile = _profile()
    plain = simulate(ddp, topology=profile.topology(2, "fp32"), serial=True).step_time_s
    profile.series_late = {"2": -2e-5}
    assert simulate(ddp, topology=profile.topology(2, "fp32"), serial=True).step_time_s == plain


def test_a_later_call_never_prices_its_steps_below_nothing():
    """A shift larger than the step latency (noise in a calibration) leaves the step's latency at 0, not below."""
    scenario, _ = _zero3(2)
    profile = _profile()
    profile.series_late = {"2": -10.0}
    floor = simulate(scenario, topology=profile.topology(2, "fp32"), serial=True).step_time_s
    profile.series_late = {"2": -20.0}
    assert simulate(scenario, topology=profile.topology(2, "fp32"), serial=True).step_time_s == floor > 0


def test_a_world_size_without_its_own_measurement_prices_no_shift():
    """The shift is measured where the ranks do not outnumber the cores: a profile with it at 2 ranks alone
    prices 4 ranks' series at the step latency (no nearest world's figure borrowed)."""
    profile = _profile()
    profile.series_late = {"2": -2e-5}
    assert profile.topology(2, "fp32").series_late == (5, -2e-5)
    assert profile.topology(4, "fp32").series_late is None
