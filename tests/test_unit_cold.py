"""The caches a once-a-step unit finds cold (calibrate/cold.py): timed gaps, the fit, and the price."""

import math

import pytest

from simpar.calibrate.cold import TAUS, GapClock, cold_share
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate
from tests.test_calibrate import _profile


def test_the_gap_clock_times_each_op_since_the_last_of_its_kind_and_phase():
    clock = GapClock()
    step = [("embedding", "fwd", 0.0, 1.0), ("layer", "fwd", 1.0, 2.0), ("layer", "fwd", 2.5, 3.0),
            ("layer", "bwd", 3.0, 4.0), ("embedding", "bwd", 4.0, 5.0)]
    returned = [clock.add_step([(kind, phase, start + 10 * k, end + 10 * k) for kind, phase, start, end in step], k == 2)
                for k in range(3)]  # the first step's ops have no op before them; the second's are left out
    assert returned[0] == [None, None, 0.5, None, None] and returned[1] == returned[2] == [9.0, 8.0, 0.5, 9.0, 9.0]
    assert clock.gaps("embedding", "fwd") == [9.0]  # from the step before's end (1.0 + 10) to 20.0
    assert clock.gaps("layer", "fwd") == [8.0, 0.5]  # 13.0 -> 21.0; the second layer right after the first
    assert clock.gaps("layer", "bwd") == [9.0]
    assert clock.gaps("head", "fwd") == []
    assert cold_share([0.0, 1e9], 1e-3) == pytest.approx(0.5)
    assert cold_share([2e-3], 2e-3) == pytest.approx(1 - math.exp(-1))
    assert cold_share([], 2e-3) == cold_share([5e-3], 0.0) == 0.0


def _rows(tau: float, cold: dict) -> list[dict]:
    """Rows as compute_worker writes them, whose embedding and head pay ``cold`` x their gaps' share."""
    rows = []
    for model_gap, scale in ((3e-3, 1.0), (12e-3, 1.0), (30e-3, 2.0)):
        for batch in (1, 2, 4):
            for kind, overhead, gaps in (("embedding", 40e-6, [model_gap * batch]), ("head", 90e-6, [model_gap * batch]),
                                         ("layer", 200e-6, [model_gap, 1e-4, 1e-4])):
                flops = 1e6 * batch * scale * (kind != "embedding")
                row = {"unit": kind, "scores": 0, "table": 0}
                for phase, rate in (("fwd", 5e10), ("bwd", 4e10)):
                    paid = cold.get((kind, phase), 0.0) * cold_share(gaps, tau)
                    row |= {f"{phase}_flops": flops, f"{phase}_gaps": gaps, f"{phase}_s": overhead + flops / rate + paid}
                rows.append(row)
    return rows


def test_the_fit_recovers_a_planted_cold_cost_and_its_decay_time():
    """Rows whose embedding and head pay a cold cost by their gaps (tau 5 ms): the fit at that tau gives back
    every term, and of the decay times it tries that one leaves the least error."""
    from simpar.calibrate.fits import fit_unit_costs, unit_fit_residual

    cold = {("embedding", "fwd"): 150e-6, ("head", "fwd"): 120e-6, ("head", "bwd"): 300e-6}
    rows = _rows(5e-3, cold)
    costs, extra = fit_unit_costs(rows, "fwd", (), 5e-3)
    assert costs == pytest.approx([40e-6, 200e-6, 90e-6, 5e10], rel=1e-6)
    assert extra == pytest.approx({"cold_embedding": 150e-6, "cold_head": 120e-6}, rel=1e-6)
    assert fit_unit_costs(rows, "bwd", (), 5e-3)[1] == pytest.approx({"cold_embedding": 0.0, "cold_head": 300e-6},
                                                                     abs=1e-12)
    assert min(TAUS, key=lambda t: unit_fit_residual(rows, "fwd", (), t)) == 5e-3
    assert fit_unit_costs(rows, "fwd")[1] == {}  # without tau: the overheads alone, as before


def test_embeddings_and_heads_pay_their_cold_caches_by_the_compute_since_the_last_of_their_kind():
    """DDP, one micro-batch: the embedding's and head's forward and backward each pay cold x (1 - exp(-gap /
    tau)), ``gap`` the rest of the step's compute (every compute's time and resume, at the ranks' shared
    speed, less the op's own); no other op pays; the step is longer by one rank's sum; replay equals the
    full simulation; a profile without ``unit_cold`` prices as before."""
    from simpar.sim.cores import slowdown_at
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    scenario = make_scenario(model("tiny-deep"), "ddp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    profile = _profile()
    plain = simulate(scenario, topology=profile.topology(2, "fp32"), serial=True).step_time_s
    assert not OpCosts(plan, scenario, profile.topology(2, "fp32")).cold
    tau, cold = 4e-3, {"fwd": {"embedding": 1e-4, "head": 2e-4}, "bwd": {"embedding": 3e-5, "head": 4e-4}}
    profile.unit_cold = {"fp32": {"tau": tau, **cold}}
    topology = profile.topology(2, "fp32")
    costs = OpCosts(plan, scenario, topology)
    prog = plan.programs[0]
    slow = slowdown_at(topology.core_slowdown, 2)
    durations = {op.id: (costs.compute_time(prog, op) + costs.after_network.get((0, op.id), 0.0)) * slow
                 for op in prog.ops if op.__class__.__name__ == "Compute"}
    paying = {op.id: cold[op.phase][scenario.model.unit_kind(op.unit)] for op in prog.ops
              if getattr(op, "phase", None) in ("fwd", "bwd") and op.unit in (0, scenario.model.layers + 1)}
    assert len(paying) == 4
    expected = {(0, i): c * (1 - math.exp(-(sum(durations.values()) - durations[i]) / tau)) for i, c in paying.items()}
    assert {key: value for key, value in costs.cold.items() if key[0] == 0} == pytest.approx(expected, rel=1e-9)
    after = simulate(scenario, topology=topology, serial=True).step_time_s
    assert after - plain == pytest.approx(sum(expected.values()), rel=1e-6)
    assert simulate(scenario, topology=topology, serial=True, replay=False).step_time_s == pytest.approx(after, rel=1e-12)


def test_profiles_average_their_cold_caches_and_units_fitted_with_them():
    from simpar.calibrate.average import average_profiles

    one, two = _profile(), _profile()
    one.unit_cold = {"fp32": {"tau": 4e-3, "fwd": {"embedding": 1e-4, "head": 2e-4}, "bwd": {"embedding": 0.0, "head": 3e-4}}}
    two.unit_cold = {"fp32": {"tau": 8e-3, "fwd": {"embedding": 3e-4, "head": 2e-4}, "bwd": {"embedding": 2e-5, "head": 1e-4}}}
    before = _profile()  # calibrated before the cold caches were fitted apart: its units' overheads hold them
    before.compute = {"fp32": {"fwd": [90e-6, 100e-6, 150e-6, 50e9], "bwd": [40e-6, 200e-6, 190e-6, 40e9]}}
    profile = average_profiles([one, two, before], ["a", "b", "c"])
    assert profile.compute == one.compute  # a and b's (the same), not c's
    averaged = profile.unit_cold["fp32"]
    assert averaged["tau"] == pytest.approx(6e-3)
    assert averaged["fwd"] == pytest.approx({"embedding": 2e-4, "head": 2e-4})
    assert averaged["bwd"] == pytest.approx({"embedding": 1e-5, "head": 2e-4})
