"""A tensor-parallel piece's own cost (calibrate/tp_bench.py): timed on one rank, fitted against the
simulator's price of the same pieces, and priced on every layer piece of a tp > 1 plan; the
vocabulary-parallel embedding's and head's likewise, each its own."""

from dataclasses import replace

import pytest

from simpar.calibrate.average import average_profiles
from simpar.calibrate.tp_bench import TP, fit_tp_pieces, tp_piece_worker
from simpar.models import model
from simpar.plan import Compute
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from tests.test_calibrate import _profile

PIECE = {"fwd": 70e-6, "bwd": 150e-6}
ENDS = {"embedding_fwd": 30e-6, "head_fwd": 200e-6, "head_bwd": 50e-6, "embedding_bwd": 10e-6}


def _priced(profile, strategy: str, world: int, batch: int = 2, name: str = "tiny-deep") -> dict:
    scenario = make_scenario(model(name), strategy, world, micro_batch=batch, precision="fp32", topology="cpu-host")
    plan = build_plan(scenario)
    prog = plan.programs[0]
    costs = OpCosts(plan, scenario, profile.topology(world, "fp32"))
    return {op.id: (op, costs.compute_time(prog, op)) for op in prog.ops if isinstance(op, Compute)}


def test_every_layer_piece_of_a_tensor_parallel_plan_pays_the_piece_cost_and_nothing_else_does():
    plain, profile = _profile(), replace(_profile(), tp_piece={"fp32": {**PIECE, **ENDS}})
    for strategy, world in (("tp", 2), ("tp", 4), ("ddp", 2), ("zero3", 2), ("pp", 2)):
        before, after = _priced(plain, strategy, world), _priced(profile, strategy, world)
        spec = model("tiny-deep")
        for op_id, (op, seconds) in after.items():
            expected = 0.0
            if strategy == "tp" and op.phase in PIECE:  # a layer's piece, or the embedding or head whole
                expected = PIECE[op.phase] if op.part else ENDS[f"{spec.unit_kind(op.unit)}_{op.phase}"]
            assert seconds - before[op_id][1] == pytest.approx(expected, abs=1e-12)
        pieces = sum(bool(op.part) for op, _ in after.values())
        assert (pieces == 4 * 8) if strategy == "tp" else pieces == 0  # 8 layers x 2 pieces x 2 phases
    scenario = make_scenario(model("tiny-deep"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    full, replayed = (simulate(scenario, topology=profile.topology(2, "fp32"), serial=True, replay=r)
                      for r in (False, True))
    assert full.step_time_s == pytest.approx(replayed.step_time_s, rel=1e-9)
    assert full.step_time_s > simulate(scenario, topology=plain.topology(2, "fp32"), serial=True).step_time_s


def test_the_fit_recovers_what_the_pieces_cost_beyond_their_price():
    """Rows as ``tp_piece_worker`` writes them, each piece its price on the profile plus a planted cost: the fit
    gives the planted cost back; a piece cheaper than its price fits 0, not below. Rows without the embedding
    and head (a calibration before they were timed) fit the layers' alone."""
    profile = _profile()
    rows = []
    for name, batch in (("tiny", 1), ("tiny-deep", 2), ("small", 4)):
        spec, priced = model(name), _priced(profile, "tp", TP, batch, name).values()
        ends = {f"{spec.unit_kind(op.unit)}_{op.phase}": s + ENDS[f"{spec.unit_kind(op.unit)}_{op.phase}"]
                for op, s in priced if not op.part and op.phase in PIECE}
        rows.append({"model": name, "batch": batch, **ends,
                     **{phase: [s + PIECE[phase] for op, s in priced if op.part and op.phase == phase]
                        for phase in PIECE}})
    assert fit_tp_pieces(rows, profile, "fp32") == pytest.approx({**PIECE, **ENDS})
    layers_only = [{key: value for key, value in row.items() if key not in ENDS} for row in rows]
    assert fit_tp_pieces(layers_only, profile, "fp32") == pytest.approx(PIECE)
    cheaper = [{**row, "fwd": [s - 2 * PIECE["bwd"] for s in row["fwd"]]} for row in rows]
    assert fit_tp_pieces(cheaper, profile, "fp32")["fwd"] == 0.0
    # the embedding and head are timed with the caches cold, as in a step: that part is priced apart, not here
    cold = replace(profile, unit_cold={"fp32": {"tau": 2e-3, "fwd": {"embedding": 1e-4, "head": 2e-4},
                                                "bwd": {"embedding": 3e-5, "head": 1.5e-4}}})
    warm = [{**row} for row in rows]
    for row in warm:
        scenario = make_scenario(model(row["model"]), "tp", TP, micro_batch=row["batch"], precision="fp32",
                                 topology="cpu-host")
        costs = OpCosts(build_plan(scenario), scenario, cold.topology(TP, "fp32"))
        assert len(costs.cold) == 4  # the embedding's and the head's forward and backward
        for (_, op_id), seconds in costs.cold.items():
            op = build_plan(scenario).programs[0].ops[op_id]
            row[f"{scenario.model.unit_kind(op.unit)}_{op.phase}"] += seconds
    assert fit_tp_pieces(warm, cold, "fp32") == pytest.approx({**PIECE, **ENDS})
    averaged = average_profiles([replace(profile, tp_piece={"fp32": {**PIECE, **ENDS}}),
                                 replace(profile, tp_piece={"fp32": dict.fromkeys({**PIECE, **ENDS}, 0.0)})],
                                ["a", "b"])
    assert averaged.tp_piece["fp32"] == pytest.approx({key: s / 2 for key, s in {**PIECE, **ENDS}.items()})


def test_the_executor_pieces_are_timed_one_by_one_in_plan_order():
    from simpar.real.launch import launch

    rows = launch(tp_piece_worker, 1, (["tiny"], [1], 1), timeout=300)[0]
    pieces = 2 * model("tiny").layers
    assert [(r["model"], r["batch"], len(r["fwd"]), len(r["bwd"])) for r in rows] == [("tiny", 1, pieces, pieces)]
    assert all(s > 0 for r in rows for s in r["fwd"] + r["bwd"] + [r[key] for key in ENDS])
