"""The fixed-duration fast path (sim/fast.py) held to the full simulation on small 3D layouts."""

import pytest

from simpar.models import ModelSpec
from simpar.scenario import make_scenario
from simpar.sim import build_topology, simulate
from simpar.sim import fast
from simpar.strategies import build_plan

GPT = ModelSpec("gpt-24", layers=24, hidden=1024, heads=16, ffn=4096, vocab=32000, seq=1024)
LAYOUTS = [  # (pp, dp, tp, schedule, virtual stages, topology)
    (2, 2, 1, "1f1b", 1, "dgx-a100"), (2, 4, 1, "1f1b", 1, "dgx-a100"), (4, 2, 1, "1f1b", 1, "dgx-a100"),
    (4, 4, 1, "1f1b", 1, "dgx-a100"), (8, 2, 1, "1f1b", 1, "dgx-a100"), (2, 2, 2, "1f1b", 1, "dgx-a100"),
    (4, 2, 2, "1f1b", 1, "dgx-a100"), (8, 1, 2, "1f1b", 1, "dgx-a100"), (2, 4, 2, "gpipe", 1, "dgx-a100"),
    (4, 2, 1, "gpipe", 1, "dgx-a100"), (8, 2, 1, "gpipe", 1, "dgx-a100"), (2, 2, 2, "interleaved", 2, "dgx-a100"),
    (4, 2, 1, "interleaved", 2, "dgx-a100"), (4, 2, 2, "interleaved", 3, "dgx-a100"),
    (8, 2, 1, "interleaved", 3, "dgx-a100"), (2, 2, 1, "1f1b", 1, "pcie"), (4, 1, 2, "1f1b", 1, "pcie"),
    (2, 4, 1, "gpipe", 1, "pcie"), (4, 2, 1, "1f1b", 1, "dgx-h100"), (2, 2, 2, "interleaved", 2, "dgx-h100"),
    (4, 4, 2, "1f1b", 1, "dgx-a100"), (8, 4, 1, "1f1b", 1, "dgx-a100"), (4, 2, 1, "zb-h1", 1, "dgx-a100"),
    (4, 2, 2, "zb-v", 1, "dgx-a100"), (2, 2, 1, "zb-v", 1, "pcie"),
]


@pytest.mark.parametrize("pp,dp,tp,schedule,v,topology", LAYOUTS)
def test_fast_path_matches_the_full_simulation(pp, dp, tp, schedule, v, topology):
    """Within 0.5 % (what it leaves out: contention between overlapping ops, e.g. the data-parallel
    reduction of a finished stage with the cool-down's sends of the others)."""
    scenario = make_scenario(GPT, "3d", pp * dp * tp, pp=pp, dp=dp, tp=tp, schedule=schedule, virtual_stages=v,
                             microbatches=2 * pp, topology=topology, recompute="full")
    topo, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topo, plan=plan, check_oom=False).step_time_s
    assert fast.step_time(plan, scenario, topo) == pytest.approx(full, rel=5e-3)


def test_fast_path_equals_the_full_simulation_where_nothing_contends():
    """One stage per node, no data parallelism: no two network ops share a link, so it is exact."""
    scenario = make_scenario(GPT, "3d", 16, pp=2, dp=1, tp=8, microbatches=6, topology="dgx-a100")
    topo, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topo, plan=plan, check_oom=False).step_time_s
    assert fast.step_time(plan, scenario, topo) == pytest.approx(full, rel=1e-9)


def test_published_step_on_the_fast_path_is_close_to_the_full_simulation():
    """validate --published prices Table 1 on the fast path; --exact simulates each point in full."""
    from simpar import published

    case = [c for c in published.load() if c["set"] == "A"][4]  # 39.1B on 512 GPUs, TP 8 x PP 2
    fast_time, exact_time = published.step_time(case), published.step_time(case, exact=True)
    assert fast_time == pytest.approx(exact_time, rel=5e-3) and fast_time <= exact_time


def test_fast_path_follows_the_simulator_without_overlap():
    """overlap_comm off (a DeepSpeed config can say so): each program's ops one after another."""
    scenario = make_scenario(GPT, "3d", 8, pp=4, dp=2, tp=1, microbatches=8, topology="dgx-a100",
                             overlap_comm=False)
    topo, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topo, plan=plan, check_oom=False).step_time_s
    assert fast.step_time(plan, scenario, topo) == pytest.approx(full, rel=5e-3)


def test_validate_exact_without_published_is_refused(cli):
    done = cli("validate", "--exact")
    assert done.returncode == 2 and "--exact" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("pp,dp,tp,schedule,v,topology", LAYOUTS)
def test_fast_path_moves_exactly_the_simulated_bytes(pp, dp, tp, schedule, v, topology):
    """Bytes sent and received per rank and carried per link: the full simulation's, exactly."""
    scenario = make_scenario(GPT, "3d", pp * dp * tp, pp=pp, dp=dp, tp=tp, schedule=schedule, virtual_stages=v,
                             microbatches=2 * pp, topology=topology, recompute="full")
    topo, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topo, plan=plan, check_oom=False)
    sent, received, channels = fast.run(plan, scenario, topo)[1].traffic()
    assert [sent[topo.gpus[r["rank"]]] for r in full.ranks] == [r["bytes_sent"] for r in full.ranks]
    assert [received[topo.gpus[r["rank"]]] for r in full.ranks] == [r["bytes_received"] for r in full.ranks]
    links = {topo.channel_name(c): int(b) for c, b in enumerate(channels) if b}
    assert links == {link["name"]: link["bytes"] for link in full.links}


@pytest.mark.parametrize("pp,dp,tp,schedule,v,topology", LAYOUTS)
def test_fast_path_memory_is_the_simulated_peak(pp, dp, tp, schedule, v, topology):
    """3D plans allocate on the compute stream only: program order is time order, so the peaks per
    rank and category are the full simulation's exactly."""
    scenario = make_scenario(GPT, "3d", pp * dp * tp, pp=pp, dp=dp, tp=tp, schedule=schedule, virtual_stages=v,
                             microbatches=2 * pp, topology=topology, recompute="full")
    topo, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topo, plan=plan, check_oom=False)
    reports = fast.memory(plan)
    programs = {rank: pi for pi, prog in enumerate(plan.programs) for rank in prog.ranks}
    assert [reports[programs[r["rank"]]] for r in full.ranks] == [r["memory"] for r in full.ranks]


def test_fast_path_declines_memory_where_streams_interleave_allocations():
    scenario = make_scenario(GPT, "zero3", 8, topology="dgx-a100")
    assert fast.memory(build_plan(scenario)) is None


@pytest.mark.parametrize("pp,dp,tp,schedule,v,topology", LAYOUTS[::3])
def test_simulate_fast_reports_what_the_full_simulation_does(pp, dp, tp, schedule, v, topology):
    """simpar run's fast path: the same report (bytes and memory exactly, times within 0.5 %)."""
    scenario = make_scenario(GPT, "3d", pp * dp * tp, pp=pp, dp=dp, tp=tp, schedule=schedule, virtual_stages=v,
                             microbatches=2 * pp, topology=topology, recompute="full")
    full, quick = simulate(scenario, check_oom=False), simulate(scenario, check_oom=False, fast=True)
    assert quick.step_time_s == pytest.approx(full.step_time_s, rel=5e-3)
    for a, b in zip(quick.ranks, full.ranks):
        assert {k: a[k] for k in ("rank", "bytes_sent", "bytes_received", "offload_bytes", "memory")} == \
               {k: b[k] for k in ("rank", "bytes_sent", "bytes_received", "offload_bytes", "memory")}
        assert sum(a["breakdown"].values()) == pytest.approx(sum(b["breakdown"].values()), rel=5e-3)
    assert quick.links == full.links


def test_simulate_fast_declines_plans_that_allocate_on_several_streams():
    from simpar.errors import SimparError

    with pytest.raises(SimparError, match="the fast path: zero3 allocates memory on several streams"):
        simulate(make_scenario(GPT, "zero3", 8, topology="dgx-a100"), fast=True)


EXTRAPOLATED = [(4, 2, 1, "1f1b", 1, 13), (4, 1, 2, "gpipe", 1, 10), (2, 2, 2, "interleaved", 2, 14), (4, 1, 2, "interleaved", 2, 24),
                (8, 1, 1, "1f1b", 1, 20), (4, 2, 1, "zb-h1", 1, 13), (2, 1, 2, "zb-h1", 1, 9)]


@pytest.mark.parametrize("pp,dp,tp,schedule,v,m", EXTRAPOLATED)
def test_a_long_pipeline_extrapolated_from_two_short_ones_is_its_fast_step(pp, dp, tp, schedule, v, m):
    """``simulate(fast=True, extrapolate=True)`` (simpar run's default for pp, tp and 3d) prices m micro-batches
    from two short steps: the same step time as the fast path at m (affine once the pipeline is full), the same
    breakdown, bytes per rank and per link, and peak memory."""
    scenario = make_scenario(GPT, "3d", pp * dp * tp, pp=pp, dp=dp, tp=tp, schedule=schedule, virtual_stages=v,
                             microbatches=m, topology="dgx-a100", recompute="full")
    whole = simulate(scenario, check_oom=False, fast=True)
    short = simulate(scenario, check_oom=False, fast=True, extrapolate=True)
    assert any("micro-batches priced from" in note for note in short.notes)
    assert short.step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)
    # how the interleaved and ZB-H1 schedules' waits split between communication and bubble is not quite affine
    # in m (their sum is): within 0.5 % there, exact elsewhere
    split = 5e-3 if schedule in ("interleaved", "zb-h1") else 1e-9
    for part, seconds in whole.breakdown.items():
        assert short.breakdown[part] == pytest.approx(seconds, rel=split, abs=1e-12), part
    assert sum(short.breakdown.values()) == pytest.approx(sum(whole.breakdown.values()), rel=1e-9)
    for a, b in zip(short.ranks, whole.ranks):
        assert (a["bytes_sent"], a["bytes_received"], a["memory"]) == (b["bytes_sent"], b["bytes_received"], b["memory"])
    assert short.links == whole.links


def test_simpar_run_prices_pipelines_on_the_fast_path_and_exact_on_the_events(cli):
    """The plain command prices a 3D plan from two short steps; --exact simulates every micro-batch as events."""
    import json

    args = ("run", "--strategy", "3d", "--gpus", "16", "--pp", "4", "--tp", "2", "--model", "gpt2-large",
            "--microbatches", "12", "--json", "-")
    quick, exact = (json.loads(cli(*args, *extra).stdout)["sim"] for extra in ((), ("--exact",)))
    assert any("micro-batches priced from 4 and 5" in note for note in quick["notes"])
    assert not any("priced from" in note for note in exact["notes"])
    assert quick["step_time_s"] == pytest.approx(exact["step_time_s"], rel=5e-3)
    assert [r["bytes_sent"] for r in quick["ranks"]] == [r["bytes_sent"] for r in exact["ranks"]]


def test_the_points_priced_side_by_side_equal_the_points_priced_in_turn(monkeypatch):
    """With two cores the shorter point runs in a forked process, each side pricing half the network ops for
    the other (fast.price_shared); on one core both run here in turn. The reports are identical."""
    import os

    scenario = make_scenario(GPT, "3d", 32, pp=4, dp=2, tp=4, microbatches=16, topology="dgx-a100", recompute="full")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    alone = simulate(scenario, fast=True, extrapolate=True).to_json()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    beside = simulate(scenario, fast=True, extrapolate=True).to_json()
    assert beside == alone


def test_an_error_in_the_forked_point_is_raised_here(monkeypatch):
    import os

    from simpar.errors import SimparError

    scenario = make_scenario(GPT, "3d", 32, pp=4, dp=2, tp=4, microbatches=16, topology="dgx-a100", recompute="full")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    real = fast.price_shared

    def failing(plan, *args):
        if plan.programs and sum(len(p.ops) for p in plan.programs) < 1500:  # the shorter point's plan
            raise SimparError("the forked point failed")
        return real(plan, *args)

    monkeypatch.setattr("simpar.sim.price_shared", failing)
    with pytest.raises(SimparError, match="the forked point failed"):
        simulate(scenario, fast=True, extrapolate=True)


MOE = ModelSpec("moe-8", layers=8, hidden=1024, heads=16, ffn=2048, vocab=32000, seq=1024, experts=8, top_k=2)


@pytest.mark.parametrize("pp,dp,tp,ep", [(2, 4, 1, 2), (2, 8, 1, 4), (4, 2, 1, 2), (2, 2, 2, 4), (2, 4, 2, 8)])
def test_fast_path_matches_the_full_simulation_with_expert_parallelism(pp, dp, tp, ep):
    """MoE layers' all-to-alls on the fast path: time within 0.5 %, bytes per rank exactly."""
    scenario = make_scenario(MOE, "3d", pp * dp * tp, pp=pp, dp=dp, tp=tp, ep=ep, microbatches=2 * pp,
                             topology="dgx-a100", recompute="full", sequence_parallel=tp > 1)
    topo, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topo, plan=plan, check_oom=False)
    assert fast.step_time(plan, scenario, topo) == pytest.approx(full.step_time_s, rel=5e-3)
    sent, received, _ = fast.run(plan, scenario, topo)[1].traffic()
    assert [sent[topo.gpus[r["rank"]]] for r in full.ranks] == [r["bytes_sent"] for r in full.ranks]
