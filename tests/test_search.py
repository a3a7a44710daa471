"""simpar search: the layouts it enumerates are valid, its shortcuts equal full simulations."""

import json

import pytest

from simpar.cli import main
from simpar.models import model
from simpar.search import Candidate, Search, candidates, ranked, run_search
from simpar.sim import fast
from simpar.sim import simulate
from simpar.sim.tracker import walk
from simpar.strategies import build_plan

GPT2 = model("gpt2")


def test_candidates_are_valid_layouts_with_tp_inside_a_machine():
    found = candidates(GPT2, 16, 64, gpus_per_machine=8)
    assert found
    for c in found:
        assert c.dp * c.pp * c.tp == 16 and c.tp <= 8
        assert GPT2.layers % (c.pp * c.virtual_stages) == 0 and GPT2.heads % c.tp == 0
        assert 64 % (c.micro_batch * c.dp) == 0
        assert (c.strategy == "3d") == (c.pp * c.tp > 1)
    assert len(set(found)) == len(found)
    layouts = {(c.dp, c.pp, c.tp) for c in found}
    assert (16, 1, 1) in layouts and (2, 2, 4) in layouts and (4, 1, 4) in layouts
    assert all(c.tp != 16 for c in found)  # 16-way TP would cross machines


@pytest.mark.parametrize("candidate", [
    Candidate("3d", 1, 4, 2, 1, "none"),  # 32 micro-batches through 4 stages
    Candidate("3d", 2, 2, 2, 1, "full", "interleaved", 2),
    Candidate("zero2", 8, 1, 1, 1, "selective"),  # 8 accumulated micro-batches
    Candidate("3d", 4, 1, 2, 2, "none"),
    Candidate("3d", 2, 2, 2, 1, "none", "zb-h1"),
])
def test_extrapolated_step_equals_the_full_simulation(candidate):
    """Long accumulations are priced from two short ones: the same step time and peak memory."""
    search = Search(GPT2, 8, "dgx-a100", 64)
    outcome = search.evaluate(candidate)
    assert outcome.status == "fits" and outcome.extrapolated
    scenario = search.scenario(candidate)
    plan = build_plan(scenario)
    assert outcome.step_time_s == pytest.approx(fast.step_time(plan, scenario, search.topology), rel=1e-9)
    # pricing each network op as if alone (the fast path) is the search's one approximation: small here
    full = simulate(scenario, topology=search.topology, plan=plan, check_oom=False)
    assert outcome.step_time_s == pytest.approx(full.step_time_s, rel=1e-2)
    # --exact: each point simulated in full, the micro-batch extrapolation the only approximation left
    exact = Search(GPT2, 8, "dgx-a100", 64, exact=True).evaluate(candidate)
    assert exact.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    assert outcome.peak_bytes == max(walk(p).peak["gpu"] for p in plan.programs)


def test_memory_cap_sorts_out_what_does_not_fit():
    search = Search(model("llama2-7b"), 8, "dgx-a100", 8, memory_cap=40e9)
    ddp = search.evaluate(Candidate("ddp", 8, 1, 1, 1, "full"))
    assert ddp.status == "oom" and ddp.peak_bytes > 40e9  # 16 bytes per parameter alone is 108 GB
    zero3 = search.evaluate(Candidate("zero3", 8, 1, 1, 1, "full"))
    assert zero3.status == "fits" and zero3.peak_bytes <= 40e9


def test_parallel_search_gives_the_same_ranking():
    args = (GPT2, 8, "dgx-a100", 16, "bf16-mixed", "adam", None)
    todo = Search(*args).candidates()
    alone, together = run_search(args, todo, jobs=1), run_search(args, todo, jobs=2)
    assert [(o.candidate, o.step_time_s) for o in ranked(alone)] == [(o.candidate, o.step_time_s)
                                                                     for o in ranked(together)]
    best = ranked(alone)
    assert all(a.step_time_s <= b.step_time_s for a, b in zip(best, best[1:]))


def test_search_command(capsys):
    assert main(["search", "--model", "gpt2", "--gpus", "8", "--global-batch", "16", "--jobs", "1",
                 "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    counts = out["counts"]
    assert counts["configurations"] == counts["fit"] + counts["over_memory_cap"] + counts["invalid"]
    assert out["ranked"] and out["ranked"][0]["step_time_s"] == min(r["step_time_s"] for r in out["ranked"])
    assert main(["search", "--model", "gpt2", "--gpus", "8", "--global-batch", "16", "--jobs", "1",
                 "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "evaluated" in printed and "  1  " in printed and "  4  " not in printed


@pytest.mark.parametrize("argv, message", [
    (["--memory-cap", "1e6"], "--memory-cap: no layout fits"),
    (["--strategies", "zero9"], "--strategies: unknown zero9"),
    (["--topology", "moon"], "--topology: unknown preset 'moon'"),
    (["--global-batch", "1"], "--global-batch: no layout"),
    (["--model", "nope"], "--model: unknown preset"),
])
def test_search_errors(capsys, argv, message):
    assert main(["search", "--model", "gpt2", "--gpus", "8", "--global-batch", "16", "--jobs", "1", *argv]) == 2
    assert message in capsys.readouterr().err
