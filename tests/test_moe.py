"""Mixture-of-Experts: exact parameter counts, active-expert FLOPs, the all-to-all's bytes, bad input."""

import json
import math

import pytest

from simpar.collectives import expand
from simpar.models import PRESETS, model
from simpar.models.hf import load_config
from simpar.models.moe import buffer_rows, dropped_share
from simpar.plan import Collective, Compute
from simpar.scenario import make_scenario
from simpar.sim import build_topology, simulate
from simpar.strategies import build_plan
from simpar.strategies.work import Work


def test_mixtral_counts_equal_the_published_ones():
    m = model("mixtral-8x7b")
    # per layer: attention 4096 x (2 x 4096 + 2 x 1024), 2 RMSNorms, router 4096 x 8, 8 SwiGLU experts of 14336
    layer = 4096 * (2 * 4096 + 2 * 1024) + 2 * 4096 + 4096 * 8 + 8 * 3 * 4096 * 14336
    assert m.params == 2 * 32000 * 4096 + 32 * layer + 4096 == 46_702_792_704  # "46.7B total"
    assert m.active_params == m.params - 32 * 6 * 3 * 4096 * 14336 == 12_879_925_248  # "12.9B active"
    assert round(m.params / 1e9, 1) == 46.7 and round(m.active_params / 1e9, 1) == 12.9


def test_deepseek_moe_counts_equal_the_published_ones():
    m = model("deepseek-moe-16b")
    expert = 3 * 2048 * 1408
    attention = 4 * 2048 * 2048 + 2 * 2048
    dense = attention + 3 * 2048 * 10944
    moe = attention + 2048 * 64 + (64 + 2) * expert
    assert m.params == 2 * 102400 * 2048 + dense + 27 * moe + 2048 == 16_375_728_128  # "16.4B"
    assert m.active_params == m.params - 27 * (64 - 6) * expert == 2_828_650_496  # "2.8B activated"
    assert [m.unit_kind(u) for u in (0, 1, 2, 28, 29)] == ["embedding", "layer", "moe", "moe", "head"]


def test_flops_count_the_routed_experts_only():
    m = model("mixtral-8x7b")
    twice = m.__class__(**{**m.__dict__, "experts": 16})
    # more experts at the same top-k: more parameters, the same FLOPs but for the router's 8 more columns
    assert twice.params > m.params
    extra = twice.layer_forward_flops(1, "moe") - m.layer_forward_flops(1, "moe")
    assert extra == 2 * m.seq * m.hidden * 8
    # against a dense layer of the same MLP: top-2 experts are two MLPs, plus the router
    assert m.layer_forward_flops(1, "moe") - m.layer_forward_flops(1) == 2 * m.seq * (
        m.hidden * 8 + m.mlp_weights(m.ffn))


@pytest.mark.parametrize("name, config", [
    ("mixtral-8x7b", {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                      "vocab_size": 32000, "max_position_embeddings": 4096, "num_local_experts": 8,
                      "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02}),
    ("deepseek-moe-16b", {"model_type": "deepseek", "num_hidden_layers": 28, "hidden_size": 2048,
                          "num_attention_heads": 16, "intermediate_size": 10944, "vocab_size": 102400,
                          "max_position_embeddings": 4096, "n_routed_experts": 64, "num_experts_per_tok": 6,
                          "moe_intermediate_size": 1408, "n_shared_experts": 2, "first_k_dense_replace": 1,
                          "moe_layer_freq": 1}),
])
def test_hugging_face_configs_import_to_the_presets_counts(tmp_path, name, config):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    spec, notes = load_config(str(path))
    assert (spec.params, spec.active_params) == (PRESETS[name].params, PRESETS[name].active_params)
    assert all("num_local_experts" not in note for note in notes)


def _alltoalls(plan):
    return [op for op in plan.programs[0].ops if isinstance(op, Collective) and op.op == "alltoall"]


@pytest.mark.parametrize("name, imbalance, factor", [("tiny-moe", 1.0, 1.5), ("mixtral-8x7b", 1.5, 1.5),
                                                     ("mixtral-8x7b", 1.0, 1.0)])
def test_alltoall_bytes_per_rank_equal_the_formula(name, imbalance, factor):
    m = model(name)
    ep, b = 4, 2
    scenario = make_scenario(m, "ddp", 8, micro_batch=b, ep=ep, expert_imbalance=imbalance)
    calls = _alltoalls(build_plan(scenario))
    # dispatch and combine in forward, their gradients in backward, for every MoE layer
    assert len(calls) == 4 * m.moe_layers
    tokens = b * m.seq
    formula = tokens * m.top_k * m.hidden * 2 * factor * (ep - 1) / ep  # bf16; f: capacity factor or imbalance
    topology = build_topology(scenario)
    for call in calls:
        phases = expand("alltoall", call.algo, topology, topology.gpus[:ep], call.nbytes)
        sent = sum(t.nbytes for p in phases for t in p.transfers if t.src == topology.gpus[0])
        assert sent == pytest.approx(formula, rel=1e-12)


def test_simulated_traffic_is_the_alltoalls_plus_the_gradient_reduction():
    m = model("tiny-moe")
    scenario = make_scenario(m, "ddp", 4, ep=2, precision="fp32", topology="pcie")
    result = simulate(scenario)
    rows = buffer_rows(m, 1)
    alltoall = 4 * m.moe_layers * rows * m.hidden * 4 // 2
    expert = m.moe_layers * m.experts // 2 * m.expert_params()
    dense = m.params - m.moe_layers * m.experts * m.expert_params()
    # the dense gradients all-reduced over 4 ranks, the experts' over the 2 that hold the same ones
    ring = 2 * 3 / 4 * dense * 4 + 2 * 1 / 2 * expert * 4
    assert result.ranks[0]["bytes_sent"] == pytest.approx(alltoall + ring, rel=1e-9)


def test_with_tensor_parallelism_each_rank_routes_its_share_of_the_sequence():
    """Megatron-Core: sequence-parallel input, experts whole on their rank, the ep group carved from the stage's
    dp x tp ranks; attention split by TP, the norms, router and shared experts whole (summed over TP)."""
    m = model("deepseek-moe-16b")
    base = dict(gpus=32, recompute="full", microbatches=4, topology="dgx-a100")
    one = make_scenario(m, "3d", pp=2, ep=8, **base)
    two = make_scenario(m, "3d", pp=2, tp=2, ep=8, sequence_parallel=True, **base)
    a2a = {tp: _alltoalls(build_plan(s)) for tp, s in ((1, one), (2, two))}
    assert len(a2a[1]) == len(a2a[2]) and a2a[2][0].nbytes * 2 == a2a[1][0].nbytes  # half the tokens a rank
    plan = build_plan(two)
    assert plan.grid.group(3, "ep") == tuple(range(8)) and plan.grid.group(3, "edp") == (3, 11)
    unit = next(u for u in range(1, m.layers + 1) if m.unit_kind(u) == "moe")
    whole = 2 * m.final_norm_params() + m.hidden * m.experts + m.shared_experts * m.expert_params()
    units = Work(two).units
    assert units[unit].params == m.attention_weights() // 2 + whole + m.experts // 8 * m.expert_params()
    assert units[unit].replicated == whole  # norms, router and shared experts: summed over TP after backward
    stage = plan.programs[0]
    held = {op.unit for op in stage.ops if isinstance(op, Compute) and op.unit >= 0}
    summed = [op for op in stage.ops if isinstance(op, Collective) and op.payload == "sequence-parallel grads"]
    assert [op.nbytes for op in summed] == [2 * sum(units[u].replicated for u in held)]
    assert simulate(two, check_oom=False).step_time_s > 0


def test_expert_parallelism_splits_the_experts_memory():
    m = model("mixtral-8x7b")
    memory = {ep: simulate(make_scenario(m, "zero2", 64, ep=ep, recompute="full"), check_oom=False)
              .ranks[0]["memory"]["params"] for ep in (1, 8)}
    experts = m.moe_layers * m.experts * m.expert_params()
    assert memory[1] - memory[8] == 2 * experts * 7 / 8


def test_capacity_drops_the_busiest_experts_overflow():
    m = model("tiny-moe")  # capacity factor 1.5
    assert dropped_share(m, 1.0) == 0.0
    assert dropped_share(m, 2.0) == pytest.approx(0.5 / m.experts)
    assert buffer_rows(m, 1) == m.experts * math.ceil(1.5 * 2 * 32 / 4)
    assert dropped_share(model("mixtral-8x7b"), 3.0) == 0.0  # without a capacity factor nothing drops


@pytest.mark.parametrize("args, flag", [
    (["--model", "mixtral-8x7b", "--ep", "3", "--gpus", "6"], "--ep"),
    (["--model", "mixtral-8x7b", "--ep", "4", "--gpus", "6"], "--ep"),
    (["--model", "gpt2", "--ep", "2"], "--ep"),
    (["--model", "mixtral-8x7b", "--ep", "2", "--strategy", "zero3"], "--ep"),
    (["--model", "mixtral-8x7b", "--top-k", "9"], "--top-k"),
    (["--model", "mixtral-8x7b", "--capacity-factor", "0"], "--capacity-factor"),
    (["--model", "mixtral-8x7b", "--capacity-factor", "-1"], "--capacity-factor"),
    (["--model", "mixtral-8x7b", "--expert-imbalance", "5"], "--expert-imbalance"),
    (["--model", "mixtral-8x7b", "--a2a-algo", "ring"], "--a2a-algo"),
    (["--model", "mixtral-8x7b", "--strategy", "3d", "--tp", "2"], "--sequence-parallel"),
    (["--model", "mixtral-8x7b", "--strategy", "3d", "--tp", "2", "--sequence-parallel", "--tp-comm-overlap"],
     "--tp-comm-overlap"),
    (["--model", "tiny-moe", "--strategy", "3d", "--tp", "2", "--gpus", "2", "--sequence-parallel", "--compare-real"],
     "--tp"),
    (["--strategy", "zero3", "--gpus", "16", "--zeropp-hpz", "3"], "--zeropp-hpz"),
    (["--strategy", "zero3", "--gpus", "24", "--topology", "dgx-a100", "--zeropp-hpz", "6"], "--zeropp-hpz"),
    (["--strategy", "zero2", "--zeropp-qwz"], "--zeropp-qwz"),
    (["--strategy", "hsdp", "--gpus", "16", "--shard-size", "3"], "--shard-size"),
    (["--strategy", "zero3", "--shard-size", "4"], "--shard-size"),
])
def test_bad_moe_and_sharding_input_is_one_line_and_exit_2(cli, args, flag):
    out = cli("run", *args)
    assert out.returncode == 2, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and lines[0].startswith("simpar: error:"), out.stderr


def _saved_bytes(module, run) -> int:
    """Bytes of the tensors autograd saves while ``run`` runs, parameters left out (as the executor counts)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


@pytest.mark.parametrize("changes, b", [({}, 1), ({"experts": 8, "top_k": 4, "capacity_factor": 3.0}, 2),
                                        ({"activation": "swiglu", "top_k": 1, "shared_experts": 1, "capacity_factor": 4.0}, 2)])
def test_executor_moe_activations_are_what_autograd_saves_whole_and_in_parts(changes, b):
    """(A dropped copy saves 24 bytes less, its dispatch indices: these routings drop none.)"""
    import dataclasses

    import torch

    from simpar.models.moe import executor_activation_bytes
    from simpar.real.comm import CountingComm
    from simpar.real.experts import ExpertParallel
    from simpar.real.model import build_model

    spec = dataclasses.replace(model("tiny-moe"), **changes)
    x = torch.randn(b, spec.seq, spec.hidden, requires_grad=True)
    gpt = build_model(spec)
    assert _saved_bytes(gpt, lambda: gpt.units[1](x)) == executor_activation_bytes(spec, b, 4)
    parts = ExpertParallel(gpt, 0, [0])  # expert parallelism's three parts, the all-to-alls within one rank

    def in_parts():
        comm = CountingComm(0)
        parts.forward(1, 0, "attn", x)
        parts.alltoall(comm, 1, 0, "dispatch")
        parts.forward(1, 0, "experts", None)
        parts.alltoall(comm, 1, 0, "combine")
        parts.forward(1, 0, "combine", None)
    assert _saved_bytes(gpt, in_parts) == executor_activation_bytes(spec, b, 4)


def test_the_published_suite_expresses_moe_zeropp_and_alltoall_cases():
    from simpar.published import run_case

    mixtral = {k: v for k, v in model("mixtral-8x7b").__dict__.items() if k != "name"}
    cases = [
        {"id": "moe", "set": "T", "hardware": "dgx-h100", "quantity": "tflops_per_gpu", "measured": 100.0,
         "model": {"name": "mixtral", **mixtral}, "layout": {"gpus": 64, "tp": 1, "pp": 4, "ep": 8},
         "micro_batch": 1, "batch": 256, "recompute": "full"},
        {"id": "zero++", "set": "T", "hardware": "dgx-a100", "quantity": "tflops_per_gpu", "measured": 100.0,
         "strategy": "zero3", "options": {"zeropp_qwz": True, "zeropp_hpz": 8, "zeropp_qgz": True},
         "model": {k: v for k, v in model("llama2-7b").__dict__.items()}, "layout": {"gpus": 32, "tp": 1, "pp": 1},
         "micro_batch": 1, "batch": 32, "recompute": "full"},
        {"id": "a2a", "set": "T", "hardware": "dgx-h100", "quantity": "busbw_GBps", "measured": 40.0,
         "collective": {"op": "alltoall", "gpus": 16, "bytes": 2**28}},
    ]
    for case in cases:
        row = run_case(case)
        assert "skipped" not in row and row["simulated"] > 0, row
