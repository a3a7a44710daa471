"""The wait for the slowest rank as a measured curve of the compute before a call (``wake_curve``): what the
simulator prices with it."""

import pytest

from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate
from tests.test_calibrate import _profile


def test_a_measured_wake_curve_prices_the_call_after_the_steps_compute_by_interpolation():
    """The same DDP step, the growth measured at several lengths of compute (``wake_curve``): the call after
    the whole step's compute pays the wake and the curve read at that compute (interpolated between the
    measured points, on at the last piece's slope beyond them), exactly; the simulation's step is longer
    by just that; the fast path equals the full simulation."""
    from simpar.plan import Collective, Compute
    from simpar.sim.op_costs import OpCosts
    from simpar.sim.runner import Simulator
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny-deep"), "ddp", 4, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    call = next(op for op in plan.programs[0].ops if isinstance(op, Collective))

    def simulated(curve) -> Simulator:
        profile = _profile()
        profile.wake, profile.wake_phase = {"4": 1e-3}, {"4": 1e-3}
        profile.wake_curve = {"4": curve} if curve else {}
        sim = Simulator(plan, scenario, profile.topology(4, "fp32"), serial=True)
        sim.run()
        return sim

    flat = simulated([[1e-3, 2e-3], [0.0, 0.0]])
    computed = sum(flat.times[0][op.id][2] - flat.times[0][op.id][1]
                   for op in plan.programs[0].ops if isinstance(op, Compute))
    assert computed > 4e-3
    through = [[1e-3, computed / 2, 2 * computed], [0.0, 1e-3, 3e-3]]  # computed lies between points 2 and 3
    rise = 1e-3 + 2e-3 * (computed - computed / 2) / (2 * computed - computed / 2)
    grown = simulated(through)
    assert OpCosts(plan, scenario, grown.topology).wake(0, call) == pytest.approx(1e-3 + rise)
    assert grown.env.now - flat.env.now == pytest.approx(rise, rel=1e-6)
    beyond = [[1e-3, computed / 4, computed / 2], [0.0, 1e-3, 2e-3]]  # on at 1 ms per quarter of it
    topology = simulated(beyond).topology
    assert topology.wake_rise(computed) == pytest.approx(4e-3)
    assert topology.wake_rise(0.5e-3) == 0.0  # below the first point: nothing
    topology.core_slowdown = None
    full, fast = simulate(scenario, topology=topology), simulate(scenario, topology=topology, fast=True)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
