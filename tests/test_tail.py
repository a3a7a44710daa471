"""The resume's tail (calibrate/tail.py): after a call every compute but the first, up to the next network op, is
priced a calibrated fraction longer; the fit, its micro-benchmark, averaging, and the fast path held to it."""

import pytest

from simpar.calibrate.average import average_profiles
from simpar.calibrate.tail import fit_tail, position_means, tail_worker
from simpar.models import model
from simpar.plan import Collective, Compute, Recv, Send
from simpar.real.launch import launch
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from tests.test_accumulation import _scenario
from tests.test_tensor_work import _profile

TAIL = 0.05


def _computes_after_the_first(prog) -> set[int]:
    """Ids of the computes that come after a network op but not first after it, round the step (the ops after
    the step's last call carry on into its first computes)."""
    ops = [op for op in prog.ops if isinstance(op, (Compute, Collective, Send, Recv))]
    paying, called, last = set(), False, None
    for op in ops + ops:  # two laps: the step's first computes follow the step before's last call
        if isinstance(op, Compute) and op.device == "gpu":
            if called and not isinstance(last, (Collective, Send, Recv)):
                paying.add(op.id)
        called = called or isinstance(op, (Collective, Send, Recv))
        last = op
    return paying


@pytest.mark.parametrize("strategy, microbatches", [("ddp", 1), ("pp", 4), ("tp", 1), ("zero3", 1)])
def test_every_compute_after_the_first_after_a_call_pays_the_fraction_of_its_time(strategy, microbatches):
    scenario = _scenario(strategy, microbatches)
    plan = build_plan(scenario)
    tailed = OpCosts(plan, scenario, _profile(resume_tail={"2": TAIL}).topology(2, "fp32"))
    plain = OpCosts(plan, scenario, _profile().topology(2, "fp32"))
    for pi, prog in enumerate(plan.programs):
        paying = _computes_after_the_first(prog)
        assert paying  # every one of these strategies has computes after a call's first
        for op in prog.ops:
            if isinstance(op, Compute):
                extra = TAIL * tailed.compute_time(prog, op) if op.id in paying else 0.0
                assert tailed.resume(pi, op) == pytest.approx(plain.resume(pi, op) + extra, rel=1e-12, abs=1e-15)


def test_ddp_pays_it_on_its_forward_and_backward_not_on_the_optimizer_step_right_after_its_call():
    scenario = _scenario("ddp", 1)
    plan = build_plan(scenario)
    prog = plan.programs[0]
    step = next(op for op in prog.ops if isinstance(op, Compute) and op.phase == "step")
    paying = _computes_after_the_first(prog)
    assert step.id not in paying
    assert {op.id for op in prog.ops if isinstance(op, Compute) and op.phase in ("fwd", "bwd")} == paying
    assert (simulate(scenario, topology=_profile(resume_tail={"2": TAIL}).topology(2, "fp32")).step_time_s
            > simulate(scenario, topology=_profile().topology(2, "fp32")).step_time_s)


def test_worlds_not_measured_and_one_rank_pay_nothing():
    profile = _profile(resume_tail={"2": TAIL})
    assert profile.topology(2, "fp32").resume_tail == TAIL
    assert profile.topology(4, "fp32").resume_tail == 0.0  # measured where the ranks fit the cores, for that world
    assert profile.topology(1, "fp32").resume_tail == 0.0
    scenario = make_scenario(model("tiny-deep"), "ddp", 1, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    tailed, plain = (OpCosts(plan, scenario, p.topology(1, "fp32")) for p in (profile, _profile()))
    for op in plan.programs[0].ops:
        if isinstance(op, Compute):
            assert tailed.resume(0, op) == plain.resume(0, op)


def test_the_fast_path_prices_the_tail_as_the_full_simulation():
    topology = _profile(resume_tail={"2": TAIL}).topology(2, "fp32")
    topology.core_slowdown = None
    for strategy in ("ddp", "pp"):
        scenario = _scenario(strategy, 4 if strategy == "pp" else 1)
        full = simulate(scenario, topology=topology).step_time_s
        assert simulate(scenario, topology=topology, fast=True).step_time_s == pytest.approx(full, rel=1e-9)


def test_the_fit_is_the_fraction_the_positions_after_the_first_took_longer():
    without = [4e-4, 3e-4, 3e-4, 4e-3]
    after = [6e-4, 3.3e-4, 3e-4, 4.2e-3]  # the first's +0.2 ms is the resume, left out
    assert fit_tail(after, without) == pytest.approx((0.3e-4 + 2e-4) / 4.6e-3)
    assert fit_tail([5e-4, 2.9e-4, 3e-4, 3.9e-3], without) == 0.0  # faster after the call: noise, none


def test_position_means_pool_every_rank_and_repetition():
    ranks = [{"call": [[1.0, 2.0], [3.0, 4.0]], "none": [[0.0, 0.0]]}, {"call": [[5.0, 6.0]], "none": [[2.0, 4.0]]}]
    assert position_means(ranks, "call") == [3.0, 4.0]
    assert position_means(ranks, "none") == [1.0, 2.0]


def test_profiles_average_their_tails_one_that_saw_none_counted():
    a, b = _profile(resume_tail={"2": 0.04}), _profile(resume_tail={"2": 0.0})
    assert average_profiles([a, b], ["a.json", "b.json"]).resume_tail == {"2": pytest.approx(0.02)}


def test_the_micro_benchmark_times_each_position_both_ways_on_every_rank():
    ranks = launch(tail_worker, 2, (1,), timeout=120)
    layers = 8  # tiny-deep's: each forward, then the backward and the optimizer step
    for rank in ranks:
        for kind in ("call", "none"):
            assert len(rank[kind]) == 10
            assert all(len(rep) == layers + 2 and min(rep) > 0 for rep in rank[kind])
