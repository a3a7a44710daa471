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
    (4, 4, 2, "1f1b", 1, "dgx-a100"), (8, 4, 1, "1f1b", 1, "dgx-a100"),
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
    """simpar run --fast: the same report (bytes and memory exactly, times within 0.5 %)."""
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

    with pytest.raises(SimparError, match="--fast"):
        simulate(make_scenario(GPT, "zero3", 8, topology="dgx-a100"), fast=True)
