"""Strategies priced by the simulator: exact memory and traffic, overlaps, replay, accounting."""

from dataclasses import replace

import pytest

from simpar.memory import model_states
from simpar.models import ModelSpec, model
from simpar.plan import Collective, Compute
from simpar.scenario import make_scenario
from simpar.sim import PARTS, build_topology, simulate
from simpar.sim.runner import Simulator
from simpar.strategies import build_plan

TINY = model("tiny")  # every unit's bytes divide by 4 and 8, so collectives split evenly
PHI = TINY.params
W = 2  # bf16 weights and gradients


def run(strategy, gpus=4, m=TINY, **kw):
    return simulate(make_scenario(m, strategy, gpus, **kw))


@pytest.mark.parametrize("strategy", ["dp", "ddp", "zero1", "zero2", "zero3", "zero2-offload",
                                      "zero3-offload", "zero3-infinity"])
@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_plan_memory_matches_zero_formulas(strategy, gpus):
    """Model states tracked from the Plan's Alloc ops equal the closed forms, on and off the GPU."""
    expected = model_states(strategy, PHI, gpus)
    memory = run(strategy, gpus).ranks[0]["memory"]
    assert memory["params"] == expected.params
    assert memory["grads"] == expected.grads
    assert memory["optimizer"] == expected.optimizer
    staging = 12 * PHI // gpus if strategy == "zero3-infinity" else 0  # optimizer states read in for the step
    assert memory["host"] == expected.host + staging
    assert memory["nvme"] == expected.nvme


def test_zero_formulas_for_mixed_precision_adam():
    phi, n = 7_500_000_000, 64
    assert model_states("ddp", phi, n).total == 16 * phi
    assert model_states("zero1", phi, n).total == 4 * phi + 12 * phi / n
    assert model_states("zero2", phi, n).total == 2 * phi + 14 * phi / n
    assert model_states("zero3", phi, n).total == 16 * phi / n


@pytest.mark.parametrize("gpus", [2, 4, 8])
@pytest.mark.parametrize("strategy,factor", [("ddp", 1.0), ("zero1", 1.0), ("zero2", 1.0), ("zero3", 1.5)])
def test_traffic_per_rank(strategy, factor, gpus):
    """ddp / zero1 / zero2 move 2(N-1)/N·Φ·2 bytes per rank per step; zero3 gathering whole layers
    1.5 times that (the ZeRO paper's count)."""
    expected = factor * 2 * (gpus - 1) * PHI * W // gpus
    options = {"gather_granularity": "layer"} if strategy == "zero3" else {}
    for rank in run(strategy, gpus, **options).ranks:
        assert rank["bytes_sent"] == expected
        assert rank["bytes_received"] == expected


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_worker_server_traffic(gpus):
    result = run("dp", gpus, topology="star")
    for rank in result.ranks:
        assert rank["bytes_sent"] == PHI * W and rank["bytes_received"] == PHI * W  # 2Φ·2 in all
    assert result.server["bytes_sent"] + result.server["bytes_received"] == 2 * gpus * PHI * W


def test_zero2_and_zero3_reduce_every_microbatch_but_ddp_only_once():
    layer = {"gather_granularity": "layer"}
    one = {s: run(s, 4, microbatches=1, **layer if s == "zero3" else {}).ranks[0]["bytes_sent"]
           for s in ("ddp", "zero2", "zero3")}
    three = {s: run(s, 4, microbatches=3, **layer if s == "zero3" else {}).ranks[0]["bytes_sent"]
             for s in ("ddp", "zero2", "zero3")}
    assert three["ddp"] == one["ddp"]
    reduce_scatter = 3 * PHI * W // 4  # one reduce-scatter of all gradients, (N-1)/N·Φ·2
    assert three["zero2"] == one["zero2"] + 2 * reduce_scatter
    assert three["zero3"] == 3 * one["zero3"]


@pytest.mark.parametrize("strategy", ["dp", "ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload",
                                      "zero3-infinity", "tp", "pp"])
def test_breakdown_adds_up_to_step_time(strategy):
    kw = {"pp": 2} if strategy == "pp" else {}
    result = run(strategy, 4, m=model("small"), micro_batch=2, **kw)
    assert sum(result.breakdown[p] for p in PARTS) == pytest.approx(result.step_time_s, rel=1e-9)
    for rank in result.ranks:
        assert sum(rank["breakdown"].values()) == pytest.approx(result.step_time_s, rel=1e-9)


@pytest.mark.parametrize("strategy,kw", [("ddp", {}), ("zero3", {}), ("tp", {"dp": 4})])
def test_replayed_collectives_give_the_same_answer(strategy, kw):
    scenario = make_scenario(model("gpt2"), strategy, 16, micro_batch=2, **kw)
    fast, full = simulate(scenario), simulate(scenario, replay=False)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert [r["bytes_sent"] for r in fast.ranks] == [r["bytes_sent"] for r in full.ranks]
    assert [link["bytes"] for link in fast.links] == [link["bytes"] for link in full.links]


def test_ddp_buckets_hide_communication_behind_backward():
    small = run("ddp", 16, m=model("gpt2"), bucket_bytes=25 * 2**20).breakdown["communication"]
    one = run("ddp", 16, m=model("gpt2"), bucket_bytes=2**40).breakdown["communication"]
    assert small < one


def test_zero3_prefetch_hides_gathers():
    exposed = [run("zero3", 16, m=model("gpt2"), prefetch=k).breakdown["communication"] for k in (0, 1, 2)]
    assert exposed[0] > exposed[1] >= exposed[2]


def test_offload_moves_optimizer_to_host_and_adds_pcie_time():
    gpt2 = model("gpt2")
    n = 8
    zero2, offload = run("zero2", n, m=gpt2), run("zero2-offload", n, m=gpt2)
    assert zero2.ranks[0]["memory"]["optimizer"] == 12 * gpt2.params // n
    assert offload.ranks[0]["memory"]["optimizer"] == 0
    # Adam's fp32 master, m and v, and the 16-bit gradient shard copied down (ZeRO-Offload's 14 bytes)
    assert offload.ranks[0]["memory"]["host"] == (12 + 2) * gpt2.params // n
    assert zero2.breakdown["offload"] == 0 and offload.breakdown["offload"] > 0
    # gradient shards down and new parameter shards up: 2 bytes each way per parameter of the shard
    assert offload.ranks[0]["offload_bytes"] == 2 * (W * gpt2.params // n)


def test_tensor_parallel_traffic_is_four_allreduces_per_layer():
    b, t = 2, 4
    result = run("tp", t, micro_batch=b)
    tokens = b * TINY.seq
    ring = 2 * (t - 1) / t  # of a ring all-reduce's bytes, each rank sends this share
    hidden = 4 * TINY.layers + 2  # + the embedding's output and the head's input gradient
    cross_entropy = 4 * tokens + 8 * tokens  # fp32 maxima, then sums of exp and target logits
    assert result.ranks[0]["bytes_sent"] == ring * (hidden * tokens * TINY.hidden * W + cross_entropy)


# -- pipelines: equal stages (no vocabulary to speak of), free communication ------------------
EVEN = ModelSpec("even", layers=16, hidden=1024, heads=8, ffn=4096, vocab=1, seq=512, positions=0)


def pipeline(schedule, m, v=1, p=4):
    scenario = make_scenario(EVEN, "pp", p, micro_batch=1, microbatches=m, topology="ring", bandwidth=1e18,
                             latency=0, schedule=schedule, virtual_stages=v)
    plan = build_plan(scenario)
    last = EVEN.layers + 1
    for prog in plan.programs:  # the embedding and head cost nothing, so every stage takes as long
        prog.ops = [replace(op, flops=0.0, bytes=0.0) if isinstance(op, Compute) and op.unit in (0, last) else op
                    for op in prog.ops]
    topology = build_topology(scenario)
    for gpu in topology.gpus:  # a roofline GPU, so the emptied embedding and head cost nothing (no kernels)
        node = topology.graph.nodes[gpu]
        node["spec"] = replace(node["spec"], kernels=None)
    sim = Simulator(plan, scenario, topology)
    return plan, sim, sim.run()


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_bubble_fraction(schedule, v, m):
    """Idle time of the pipeline part of the step (the optimizer step excluded) is (p-1)/(v·m+p-1)."""
    from simpar.sim.breakdown import program_breakdown

    p = 4
    plan, sim, step_time = pipeline(schedule, m, v, p)
    for pi, prog in enumerate(plan.programs):
        step = next(op for op in prog.ops if isinstance(op, Compute) and op.phase == "step")
        _, start, end = sim.times[pi][step.id]
        bubble = program_breakdown(sim, pi, step_time)["bubble"]
        # rel 1e-4: the stages' optimizer steps differ by the embedding's and final norm's few parameters
        assert bubble / (step_time - (end - start)) == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-4)


def test_1f1b_holds_at_most_p_microbatches_where_gpipe_holds_m():
    p, m = 4, 12
    per_microbatch = EVEN.layer_activation_bytes(1) * EVEN.layers // p
    for schedule, held in (("gpipe", lambda s: m), ("1f1b", lambda s: p - s)):
        _, sim, _ = pipeline(schedule, m, p=p)
        for stage in range(p):
            activations = sim.memory[stage].report()["activations"]
            extra = 4 * EVEN.seq * EVEN.vocab if stage == p - 1 else 0  # the head's logits
            assert activations == held(stage) * (per_microbatch + extra)


def test_pipeline_sends_activations_and_gradients_between_stages():
    p, m = 4, 8
    result = run("pp", p, m=EVEN, microbatches=m, topology="ring", bandwidth=1e18, latency=0)
    hidden = EVEN.seq * EVEN.hidden * W
    sent = [r["bytes_sent"] for r in result.ranks]
    assert sent == [m * hidden] + [2 * m * hidden] * (p - 2) + [m * hidden]


def test_three_d_layout_groups_and_zero1_across_dp():
    scenario = make_scenario(model("gpt2"), "3d", 16, pp=2, tp=2, micro_batch=1)
    assert (scenario.strategy.dp, scenario.strategy.pp, scenario.strategy.tp) == (4, 2, 2)
    plan = build_plan(scenario)
    assert len(plan.programs) == 2 and plan.grid.group(5, "tp") == (4, 5) and plan.grid.group(5, "dp") == (1, 3, 5, 7)
    groups = {op.group for prog in plan.programs for op in prog.ops if isinstance(op, Collective)}
    assert groups == {"tp", "dp"}
    memory = simulate(scenario).ranks[0]["memory"]
    assert memory["optimizer"] == memory["params"] // 2 * 12 // 4  # K·(stage params / tp) / dp


@pytest.mark.parametrize("strategy", ["ddp", "zero3", "zero2-offload"])
def test_serial_pricing_runs_every_op_one_after_another(strategy):
    """serial=True prices a Plan as the reference executor performs it: the step is the sum of its
    ops, and never shorter than with streams overlapping."""
    scenario = make_scenario(TINY, strategy, 4, micro_batch=2, microbatches=2)
    overlapped = simulate(scenario)
    serial = simulate(scenario, serial=True)
    assert serial.step_time_s == pytest.approx(sum(serial.ranks[0]["op_time"].values()), rel=1e-9)
    assert serial.step_time_s >= overlapped.step_time_s


def test_a_later_stage_waits_out_the_steps_tail_in_its_first_receive():
    """Serial 1F1B: steps run back to back, so a stage whose step begins with a receive waits there for the
    time left after its last op in the step before (where the executor times it): every stage's op times add
    up to the step, and the first stage, whose step begins with its own compute, is charged no tail."""
    result = simulate(make_scenario(TINY, "pp", 2, micro_batch=2, microbatches=4), serial=True)
    for rank, timeline in zip(result.ranks, result.op_timeline):
        ops = timeline["ops"]
        assert sum(rank["op_time"].values()) == pytest.approx(result.step_time_s, rel=1e-9)
        received = sum(e["end"] - e["start"] for e in ops if e["class"] == "pipeline p2p")
        tail = result.step_time_s - max(e["end"] for e in ops)
        assert rank["op_time"]["pipeline p2p"] == pytest.approx(received + (tail if rank["rank"] else 0.0), rel=1e-9)
        assert rank["rank"] == 0 or tail > 1e-6


def test_progress_is_told_as_ops_complete():
    """Long runs show a bar (simpar run): the simulator reports every PROGRESS_EVERY ops done."""
    from simpar.sim.runner import PROGRESS_EVERY

    scenario = make_scenario(model("gpt2"), "3d", 16, pp=4, tp=2, microbatches=32)
    plan = build_plan(scenario)
    told = []
    sim = Simulator(plan, scenario, build_topology(scenario), progress=told.append)
    sim.run()
    total = sum(len(p.ops) for p in plan.programs)
    assert sim.ops_done == total and told == list(range(PROGRESS_EVERY, total + 1, PROGRESS_EVERY))


def test_a_stage_is_the_ranks_whose_first_coordinate_it_is():
    from simpar.plan import Grid

    grid = Grid(dp=3, pp=4, tp=2)
    for stage in range(4):
        assert grid.stage_ranks(stage) == tuple(r for r in range(grid.world) if grid.coords(r)[0] == stage)
