"""Gradient accumulation as the executor pays it: a backward that finds its unit's gradients held from an
earlier micro-batch adds into them (autograd's in-place add a tensor), timed on one rank by the calibration and
priced per tensor and per parameter on a calibrated profile (sim/accumulation.py)."""

from types import SimpleNamespace

import pytest
import torch

import simpar.calibrate.fits as calibrate
from simpar.calibrate.handling import time_accumulate
from simpar.calibrate.profile import HardwareProfile
from simpar.models import model
from simpar.plan import Compute
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.accumulation import accumulating
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from simpar.strategies.work import Work
from tests.test_tensor_work import _profile as tensor_work_profile

ACCUMULATE = [3e-6, 1e-9]  # seconds per tensor, per parameter


def _profile(accumulate=None) -> HardwareProfile:
    return tensor_work_profile(sharded_work={"fp32": {"accumulate": accumulate}} if accumulate else {})


def _scenario(strategy: str, microbatches: int):
    return make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, microbatches=microbatches, precision="fp32",
                         topology="cpu-host")


def _backwards(prog) -> list[Compute]:
    return [op for op in prog.ops if isinstance(op, Compute) and op.phase == "bwd"]


@pytest.mark.parametrize("strategy, microbatches", [("pp", 4), ("ddp", 3), ("zero1", 2), ("tp", 2)])
def test_every_backward_after_a_units_first_in_the_step_accumulates(strategy, microbatches):
    """DDP and ZeRO-1 reduce once, after the last micro-batch; pp's stages and tp's pieces hold their own
    gradients: each (unit, piece) pays from its second backward of the step on, never its first."""
    plan = build_plan(_scenario(strategy, microbatches))
    for prog in plan.programs:
        adding = accumulating(prog, dropped_by_reduce_scatter=False)
        pieces = {(op.unit, op.part) for op in _backwards(prog)}
        assert len(adding) == len(pieces) * (microbatches - 1)
        assert all(op.microbatch > 0 for op in adding)
        assert all(op in adding for op in _backwards(prog) if op.microbatch > 0)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_a_reduce_scatter_that_drops_the_gradients_leaves_nothing_to_add_into(strategy):
    """ZeRO-2 and 3 reduce-scatter each micro-batch's gradients and keep only their shard (the executor sets
    each gradient to None): the next micro-batch's backward finds none; one micro-batch never accumulates."""
    plan = build_plan(_scenario(strategy, 2))
    assert accumulating(plan.programs[0], dropped_by_reduce_scatter=True) == []
    assert accumulating(plan.programs[0], dropped_by_reduce_scatter=False) != []  # the drop is what clears them
    assert accumulating(build_plan(_scenario("ddp", 1)).programs[0], False) == []


def test_each_accumulating_backward_pays_the_fit_per_tensor_and_parameter_and_the_step_grows():
    scenario = _scenario("pp", 4)
    plan, spec, work = build_plan(scenario), scenario.model, Work(scenario)
    costs = OpCosts(plan, scenario, _profile(ACCUMULATE).topology(2, "fp32"))
    plain = OpCosts(plan, scenario, _profile().topology(2, "fp32"))
    for pi, prog in enumerate(plan.programs):
        adding = accumulating(prog, False)
        for op in _backwards(prog):
            kind = spec.unit_kind(op.unit)
            extra = ACCUMULATE[0] * spec.unit_tensors(kind) + ACCUMULATE[1] * work.params((op.unit,))
            expected = plain.resume(pi, op) + (extra if op in adding else 0.0)
            assert costs.resume(pi, op) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    priced = simulate(scenario, topology=_profile(ACCUMULATE).topology(2, "fp32")).step_time_s
    assert priced > simulate(scenario, topology=_profile().topology(2, "fp32")).step_time_s


def test_the_fast_path_prices_the_accumulation_as_the_full_simulation():
    topology = _profile(ACCUMULATE).topology(2, "fp32")
    topology.core_slowdown = None
    scenario = _scenario("ddp", 3)
    full = simulate(scenario, topology=topology).step_time_s
    assert full > simulate(scenario, topology=_profile().topology(2, "fp32")).step_time_s
    assert simulate(scenario, topology=topology, fast=True).step_time_s == pytest.approx(full, rel=1e-9)


def test_the_fit_recovers_the_cost_per_tensor_and_parameter():
    rows = [{"model": name, "batch": b, "tensors": tensors, "params": params, "reduce_s": 1.0,
             "accumulate_s": ACCUMULATE[0] * tensors + ACCUMULATE[1] * params}
            for name, tensors, params in (("tiny", 36, 118_528), ("small", 68, 932_608)) for b in (1, 2)]
    assert calibrate.fit_sharded_work(rows) == {"accumulate": pytest.approx(ACCUMULATE)}


def test_the_timer_runs_autograd_both_ways_and_leaves_no_gradient_behind():
    """``time_accumulate`` reads every held unit's parameters (a ModelStates' ``held`` and ``unit_params``)."""
    torch.manual_seed(0)
    units = [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)]
    states = SimpleNamespace(held=(0, 1), unit_params={u: list(m.parameters()) for u, m in enumerate(units)})
    seconds = time_accumulate(states)
    assert isinstance(seconds, float) and abs(seconds) < 1.0
    assert all(p.grad is None for m in units for p in m.parameters())
