"""A ring call's later steps after a compute (calibrate/lag.py's ``later_steps``): the fit on the calibration's
phase loops, which calls pay it and how much, the world it is measured for, averaging, and the fast path."""

import pytest

from simpar.calibrate.average import average_profiles
from simpar.calibrate.lag import later_steps
from simpar.models import model
from simpar.plan import Collective
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from tests.test_tensor_work import _profile

LATER = 7e-4
# a wake and its curve: the calls right after a compute are told, with the compute before them
WAKE = {"wake": {"2": 3e-4, "4": 3e-4}, "wake_phase": {"2": 1e-4, "4": 1e-4},
        "wake_curve": {w: [[1e-4, 1e-2], [0.0, 1e-3]] for w in ("2", "4")}}


def _setup(strategy: str, world: int = 2, **extra):
    """(scenario, topology) of tiny-deep's ``strategy`` at ``world`` ranks; ``later_steps`` as if measured there."""
    scenario = make_scenario(model("tiny-deep"), strategy, world, micro_batch=2, precision="fp32", topology="cpu-host")
    topology = _profile(**WAKE, **extra).topology(world, "fp32")
    topology.later_steps = extra.get("later_steps", {}).get("2", 0.0)
    return scenario, topology


def _costs(strategy: str, world: int = 2, **extra):
    scenario, topology = _setup(strategy, world, **extra)
    plan = build_plan(scenario)
    return plan, OpCosts(plan, scenario, topology)


def test_the_fit_is_the_mean_of_the_loops_over_their_price_never_below_zero():
    extras = [0.0, 4e-4, 8e-4]
    steps, wake = 2e-3, 3e-4
    priced = [steps + wake + e for e in extras]
    assert later_steps(priced, extras, steps, wake) == pytest.approx(0.0, abs=1e-15)
    assert later_steps([p + 6e-4 for p in priced], extras, steps, wake) == pytest.approx(6e-4)
    assert later_steps([p + d for p, d in zip(priced, (1e-4, 9e-4, 5e-4))], extras, steps, wake) == pytest.approx(5e-4)
    assert later_steps([p - 2e-4 for p in priced], extras, steps, wake) == 0.0  # under their price: noise, none
    assert later_steps([], [], steps, wake) == 0.0


def test_ddps_all_reduce_after_its_step_pays_it_whole_at_two_ranks():
    plan, costs = _costs("ddp", later_steps={"2": LATER})
    _, plain = _costs("ddp")
    calls = [op for op in plan.programs[0].ops if isinstance(op, Collective)]
    assert len(calls) == 1 and calls[0].op == "allreduce"
    assert costs.wakes(0, calls[0])  # it comes right after a compute
    assert costs.wake(0, calls[0]) == pytest.approx(plain.wake(0, calls[0]) + LATER, rel=1e-12)
    with_it = simulate(*_setup("ddp", later_steps={"2": LATER}))
    without = simulate(*_setup("ddp"))
    assert with_it.step_time_s == pytest.approx(without.step_time_s + LATER, rel=1e-9)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_one_step_calls_at_two_ranks_pay_nothing(strategy):
    plan, costs = _costs(strategy, later_steps={"2": LATER})
    _, plain = _costs(strategy)
    calls = [op for op in plan.programs[0].ops if isinstance(op, Collective)]
    assert calls and all(op.op in ("allgather", "reducescatter") for op in calls)
    for op in calls:
        assert costs.wake(0, op) == plain.wake(0, op)


def test_at_four_ranks_a_call_pays_its_share_of_the_loops_later_steps():
    plan, costs = _costs("zero1", 4, later_steps={"2": LATER})
    _, plain = _costs("zero1", 4)
    paid = [(op.op, costs.wake(0, op) - plain.wake(0, op)) for op in plan.programs[0].ops
            if isinstance(op, Collective) and costs.wakes(0, op)]
    assert paid
    for op, extra in paid:  # the loops' all-reduce has 6 steps at 4 ranks, 5 after its first; a 3-step call 2 of them
        assert extra == pytest.approx(LATER * 2 / 5 if op != "allreduce" else LATER, rel=1e-12)


@pytest.mark.parametrize("strategy, world, share", [("ddp", 4, 1.0), ("ddp", 8, 1.0), ("zero2", 8, 6 / 13)])
def test_where_ranks_outnumber_the_cores_calls_pay_their_share_too(strategy, world, share):
    """Fitted at every world size since profile version 20: at 8 ranks the loops' all-reduce has 13 steps after
    its first, DDP's all-reduce all of them, ZeRO-2's 7-step reduce-scatter and all-gather 6."""
    plan, costs = _costs(strategy, world, later_steps={"2": LATER})
    _, plain = _costs(strategy, world)
    paid = [costs.wake(0, op) - plain.wake(0, op) for op in plan.programs[0].ops
            if isinstance(op, Collective) and costs.wakes(0, op) and costs.after_compute[(0, op.id)] >= 1e-4]
    assert paid and all(extra == pytest.approx(LATER * share, rel=1e-12) for extra in paid)


def test_only_the_world_measured_pays_and_profiles_average_it():
    profile = _profile(**WAKE, later_steps={"2": LATER})
    assert profile.topology(2, "fp32").later_steps == LATER
    assert profile.topology(4, "fp32").later_steps == 0.0
    a, b = _profile(later_steps={"2": 8e-4}), _profile(later_steps={"2": 0.0})
    assert average_profiles([a, b], ["a.json", "b.json"]).later_steps == {"2": pytest.approx(4e-4)}


@pytest.mark.parametrize("strategy, world", [("ddp", 2), ("zero1", 4), ("zero2", 4)])
def test_the_fast_path_prices_it_as_the_full_simulation(strategy, world):
    scenario, topology = _setup(strategy, world, later_steps={"2": LATER})
    full = simulate(scenario, topology=topology).step_time_s
    assert full > simulate(*_setup(strategy, world)).step_time_s  # it is paid
    assert simulate(scenario, topology=topology, fast=True).step_time_s == pytest.approx(full, rel=1e-9)
