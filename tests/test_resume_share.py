"""A compute right after a call pays the calibrated resume in proportion to its length, up to the
compute it was measured on (``resume_unit``): a rank computes slower for a while after a call; it is
not held up a fixed time (tp's half-layer pieces paid ~0.1 ms where the 2.3 ms unit paid 0.61 ms).
After a pipeline receive the resume is a wait for a core, paid whole (pp at 8 ranks: -14 % whole,
-28 % as a share)."""

import pytest

from simpar.calibrate.profile import HardwareProfile
from simpar.models import model
from simpar.plan import Collective, Compute, Recv, Send
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from simpar.topologies.graph import Topology


def _profile(unit: float | None) -> HardwareProfile:
    profile = HardwareProfile(
        machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
        compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
        slowdown={"1": 1.0, "2": 1.0}, ring={"2": [50e-6, 2e9]},
        optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10)
    profile.resume, profile.resume_after_recv = {"2": 6e-4}, {"2": 3e-4}
    if unit is not None:
        profile.resume_unit = {"2": unit}
    return profile


def test_a_shorter_compute_pays_its_share_a_longer_one_all_of_it():
    topology = Topology("t")
    assert topology.resume_cost(6e-4, 1e-3) == 6e-4  # no unit (older profiles): paid whole
    topology.resume_unit = 2e-3
    assert topology.resume_cost(6e-4, 5e-4) == pytest.approx(1.5e-4)
    assert topology.resume_cost(6e-4, 2e-3) == pytest.approx(6e-4)
    assert topology.resume_cost(6e-4, 8e-3) == pytest.approx(6e-4)  # not more than measured


def test_through_a_short_computes_point_the_resume_is_a_curve():
    """With a short compute's point (``resume_short``) the resume rises through it to the unit's and stays
    level; a point paid more than the unit is held to the unit's; a point not shorter than the unit is not
    used (the share); and ``resume_point`` makes the point from the loops' means."""
    topology = Topology("t")
    topology.resume_unit, topology.resume_short = 2e-3, (4e-4, 3e-4)
    assert topology.resume_cost(6e-4, 0.0) == 0.0
    assert topology.resume_cost(6e-4, 2e-4) == pytest.approx(1.5e-4)  # half the point's
    assert topology.resume_cost(6e-4, 4e-4) == pytest.approx(3e-4)
    assert topology.resume_cost(6e-4, 1.2e-3) == pytest.approx(4.5e-4)  # half way to the unit's
    assert topology.resume_cost(6e-4, 5e-3) == pytest.approx(6e-4)
    topology.resume_short = (4e-4, 9e-4)
    assert topology.resume_cost(6e-4, 4e-4) == pytest.approx(6e-4)
    assert topology.resume_cost(6e-4, 1e-3) == pytest.approx(6e-4)
    topology.resume_short = (3e-3, 1e-4)
    assert topology.resume_cost(6e-4, 5e-4) == pytest.approx(1.5e-4)
    from simpar.calibrate import resume_point

    assert resume_point(7e-4, 5e-4, 1.25) == pytest.approx([4e-4, 2e-4])
    assert resume_point(4e-4, 5e-4, 1.0) == [5e-4, 0.0]  # never less than nothing


def test_the_point_is_the_profiles_for_its_world_alone_and_tp_pays_more_with_it():
    """A profile's ``resume_short`` reaches the topology of its world only (measured where the ranks fit the
    cores); tp's pieces (shorter than the unit) pay the curve's price, each compute after a call
    ``resume_cost`` of its time, more in sum than the straight share; the fast path agrees."""
    profile = _profile(1.5e-3)
    profile.resume_short = {"2": [4e-4, 4e-4]}
    assert profile.topology(2, "fp32").resume_short == (4e-4, 4e-4)
    profile.ring["4"] = [50e-6, 2e9]
    assert profile.topology(4, "fp32").resume_short is None
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    curve = profile.topology(2, "fp32")
    costs, straight = OpCosts(plan, scenario, curve), OpCosts(plan, scenario, _profile(1.5e-3).topology(2, "fp32"))
    paid = []
    for pi, prog in enumerate(plan.programs):
        for op in prog.ops:
            if isinstance(op, Compute) and isinstance(_before(prog, op), Collective):
                assert costs.resume(pi, op) == pytest.approx(curve.resume_cost(6e-4, costs.compute_time(prog, op)))
                paid.append((costs.resume(pi, op), straight.resume(pi, op)))
    assert paid and sum(c for c, _ in paid) > sum(s for _, s in paid)
    full = simulate(scenario, topology=curve).step_time_s
    assert simulate(scenario, topology=curve, fast=True).step_time_s == pytest.approx(full, rel=1e-9)


@pytest.mark.parametrize("strategy, kwargs", [("tp", {}), ("pp", {"microbatches": 4}), ("zero3", {})])
def test_every_compute_after_a_call_pays_its_share_and_the_fast_path_agrees(strategy, kwargs):
    """Each compute right after a collective or send pays resume x min(its time / unit, 1) (less than whole
    in sum), right after a receive resume_after_recv whole, and the fast path prices it as the full
    simulation does."""
    scenario = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, precision="fp32",
                             topology="cpu-host", **kwargs)
    plan = build_plan(scenario)
    unit = 1.5e-3
    topology = _profile(unit).topology(2, "fp32")
    costs = OpCosts(plan, scenario, topology)
    checked = 0
    for pi, prog in enumerate(plan.programs):
        last = None
        for op in prog.ops:
            if isinstance(op, Compute):
                share = min(costs.compute_time(prog, op) / unit, 1.0)
                expected = 0.0
                if isinstance(last, Recv) and op.device == "gpu":
                    expected = 3e-4
                elif isinstance(last, (Collective, Send)) and op.device == "gpu":
                    expected, checked = 6e-4 * share, checked + 1
                assert costs.resume(pi, op) == pytest.approx(expected, rel=1e-9, abs=1e-15)
            if isinstance(op, (Collective, Send, Recv, Compute)):
                last = op
    assert checked > 0
    shares = sum(costs.resume(pi, op) for pi, p in enumerate(plan.programs) for op in p.ops
                 if isinstance(op, Compute) and not isinstance(_before(p, op), Recv))
    assert 0 < shares < 6e-4 * checked  # shares, not whole
    full = simulate(scenario, topology=topology).step_time_s
    fast = simulate(scenario, topology=topology, fast=True).step_time_s
    assert fast == pytest.approx(full, rel=1e-9)


def _before(prog, target):
    """The network op or compute right before ``target`` in its program."""
    last = None
    for op in prog.ops:
        if op is target:
            return last
        if isinstance(op, (Collective, Send, Recv, Compute)):
            last = op
    raise AssertionError("not in the program")


def test_older_profiles_without_the_unit_pay_the_resume_whole(tmp_path):
    path = tmp_path / "old.json"
    _profile(None).save(str(path))
    loaded = HardwareProfile.load(str(path))
    assert loaded.resume_unit == {} and loaded.topology(2, "fp32").resume_unit == 0.0
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    costs = OpCosts(plan, scenario, loaded.topology(2, "fp32"))
    paid = [costs.resume(0, op) for op in plan.programs[0].ops if isinstance(op, Compute) and costs.resume(0, op)]
    assert paid and all(p == 6e-4 for p in paid)
