"""ZeRO-3's reduce-scatter of a layer's gradients after its backward (``scatter_level``): fitted from the
executor's own backward series against what the simulator prices that call at, and what it prices with it."""

import pytest

from simpar.plan import Collective
from tests.test_calibrate import _profile
from tests.test_series_late import _zero3
from tests.test_series_level import assert_priced_per_gather


def _scatters(plan) -> list:
    """ZeRO-3's reduce-scatters of a layer's gradients coalesced by module, in the first program."""
    return [op for op in plan.programs[0].ops if isinstance(op, Collective) and op.op == "reducescatter" and op.pieces]


def test_the_level_is_what_the_call_took_beyond_the_simulators_price_of_it_per_ring_step():
    """Against the profile's price of the series' reduce-scatter after ``compute`` seconds of compute (its wake
    there, its handling, its ring), each extra second the call took is a second more at 2 ranks (one ring step)
    and a third at 4 (three); priced with the level fitted from it, the call costs what was measured."""
    from simpar.calibrate.fits import ring_price
    from simpar.calibrate.series import AFTER_BACKWARD, calls_after, scatter_level, series_scenario
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    profile = _profile()
    profile.wake, profile.wake_phase, profile.wake_short = {"2": 1e-3}, {"2": 2e-3}, {"2": [[0.5e-3, 0.5e-3]]}
    compute = 1.5e-3
    for world, steps in ((2, 1), (4, 3)):
        base = scatter_level(profile, world, "fp32", 3e-3, compute)
        assert scatter_level(profile, world, "fp32", 3e-3 + 6e-4, compute) - base == pytest.approx(6e-4 / steps)
    level = scatter_level(profile, 2, "fp32", 3e-3, compute)
    profile.scatter_level = {"2": level}
    scenario = series_scenario(2, "fp32")
    plan = build_plan(scenario)
    topology = profile.topology(2, "fp32")
    costs = OpCosts(plan, scenario, topology)
    op = calls_after(plan.programs[0].ops, *AFTER_BACKWARD)[0]
    assert op.op == "reducescatter" and op.pieces and op.payload == "grads"
    priced = (topology.collective_wake(compute) + costs.later_steps(op, compute) + costs.handling(op)
              + ring_price("reducescatter", op.nbytes, 2, *profile.ring["2"]) + costs.step_shift(0, op))
    assert priced == pytest.approx(3e-3)


def test_zero3_reduce_scatters_pay_the_level_exactly():
    """Every ZeRO-3 reduce-scatter of a layer's gradients pays ``scatter_level`` per ring step, and no other
    call does: the step is longer by it times those calls' ring steps; the fast path equals the full
    simulation; a profile without it, or a 4-rank topology, prices as before; ZeRO-2 (its reduce-scatters of
    buckets are not coalesced by module) and DDP are priced the same with it."""
    scatters = len(_scatters(_zero3(2)[1]))
    assert scatters == 10  # tiny-deep: after each of its ten units' backward (head, 8 layers, embedding)
    assert_priced_per_gather("scatter_level", 3e-4, scatters)
