"""The GPU model (simpar.costs): kernels by shape, NCCL protocols, sequence parallelism, fp32 main
gradients, MFU, and the published-measurement suite. Exact quantities only; accuracy against the
published record is `simpar validate --published` (figures in the README)."""

from __future__ import annotations

import json

import pytest

from simpar import published, topologies
from simpar.cli import main
from simpar.collective_run import simulate_collective
from simpar.costs import nccl
from simpar.costs.gpu import kernel_time
from simpar.costs.kernels import Shape, unit_kernels
from simpar.devices import presets
from simpar.errors import SimparError
from simpar.flops import model_flops
from simpar.models import ModelSpec, model
from simpar.plan import Collective, Compute
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.runner import Simulator
from simpar.strategies import build_plan

GPT = ModelSpec("gpt-1b", layers=4, hidden=2048, heads=16, ffn=8192, vocab=51200, seq=2048)
A100 = presets.gpu("a100-80gb")


def _layer_fwd_ops(scenario):
    topology = topologies.build(scenario.cluster.topology, scenario.cluster.gpus)
    sim = Simulator(build_plan(scenario), scenario, topology)
    sim.run()
    prog = sim.plan.programs[0]
    ops = [op for op in prog.ops if isinstance(op, Compute) and op.phase == "fwd" and op.unit == 1]
    return sum(sim.times[0][op.id][2] - sim.times[0][op.id][1] for op in ops), ops


def _kernel_sum(shape, kind, phase, parts):
    return sum(kernel_time(k, A100.peak_flops("bf16"), A100.memory_bandwidth, A100.kernels)
               for part in parts for k in unit_kernels(shape, kind, phase, part))


@pytest.mark.parametrize("micro_batch, tp", [(1, 1), (2, 1), (4, 1), (1, 2), (4, 4)])
def test_layer_time_is_the_kernel_models(micro_batch, tp):
    scenario = make_scenario(GPT, "tp" if tp > 1 else "ddp", tp, micro_batch=micro_batch)
    simulated, ops = _layer_fwd_ops(scenario)
    shape = Shape(GPT, micro_batch, tp)
    assert simulated == pytest.approx(_kernel_sum(shape, "layer", "fwd", [op.part for op in ops]), rel=1e-12)


def test_micro_batch_and_tp_move_compute_as_gpus_do():
    one, _ = _layer_fwd_ops(make_scenario(GPT, "ddp", 1, micro_batch=1))
    four, _ = _layer_fwd_ops(make_scenario(GPT, "ddp", 1, micro_batch=4))
    tp4, _ = _layer_fwd_ops(make_scenario(GPT, "tp", 4, micro_batch=1))
    # more tokens per GEMM run closer to peak (and the attention's s² work scales exactly): sub-linear;
    # a TP split leaves smaller GEMMs and replicated norms: more than a quarter of the time
    assert 3.0 * one < four < 4.0 * one
    assert tp4 > one / 4


def test_gemm_efficiency_falls_for_small_and_ragged_shapes():
    from simpar.costs.gpu import Gemm, gemm_time

    peak, hbm, km = A100.peak_flops("bf16"), A100.memory_bandwidth, A100.kernels
    rate = lambda g: g.flops / gemm_time(g, peak, hbm, km)  # noqa: E731
    big = rate(Gemm("big", 8192, 8192, 8192))
    assert big == pytest.approx(peak * km.gemm_efficiency * 8192 / (8192 + km.k_overhead), rel=0.02)
    assert rate(Gemm("short k", 8192, 8192, 64)) < 0.6 * big
    assert rate(Gemm("ragged", 8192, 8192 + 1, 8192)) < rate(Gemm("aligned", 8192, 8192, 8192))


def test_ring_latency_grows_with_ranks():
    times = [simulate_collective(topologies.build("dgx-a100", n), "allreduce", "ring", 4096).time_s
             for n in (8, 16, 64, 256)]
    assert times == sorted(times) and times[-1] > 5 * times[0]


def test_protocol_by_message_size():
    topology = topologies.build("dgx-a100", 8)
    assert simulate_collective(topology, "allreduce", "ring", 1024).protocol == "LL"
    assert simulate_collective(topology, "allreduce", "ring", 2**30).protocol == "Simple"
    assert simulate_collective(topologies.build("ring", 8), "allreduce", "ring", 1024).protocol is None


def test_nvls_on_h100_only():
    h100 = topologies.build("dgx-h100", 8)
    ring = simulate_collective(h100, "allreduce", "ring", 2**30)
    nvls = simulate_collective(h100, "allreduce", "nvls", 2**30)
    assert nvls.busbw_Bps > 1.2 * ring.busbw_Bps
    n, S = 8, 2**30
    assert all(r["bytes_sent"] == S + S // n for r in nvls.ranks)
    with pytest.raises(SimparError, match="--algo nvls"):
        simulate_collective(topologies.build("dgx-a100", 8), "allreduce", "nvls", S)
    with pytest.raises(SimparError, match="one NVSwitch node"):
        simulate_collective(topologies.build("dgx-h100", 16), "allreduce", "nvls", S)


def _tp_bytes(sp: bool, t: int = 2):
    scenario = make_scenario(GPT, "tp", t, micro_batch=1, sequence_parallel=sp)
    return scenario, simulate(scenario, check_oom=False)


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_moves_its_formulas_bytes(t):
    scenario, with_sp = _tp_bytes(True, t)
    _, without = _tp_bytes(False, t)
    S = GPT.seq * GPT.hidden * 2  # one micro-batch's hidden states, bf16
    tokens = GPT.seq
    share = (t - 1) / t
    # per layer: forward 2 all-gathers + 2 reduce-scatters, backward the same (Korthikanti et al.);
    # the embedding's reduce-scatter and the head's all-gather and their gradients; the cross-entropy's
    # two fp32 all-reduces as without sequence parallelism; after the backward, one all-reduce of the
    # gradients every TP rank holds whole (norms, row-parallel biases, positions: Megatron's
    # finalize_model_grads), which saw only the rank's part of the sequence
    replicated = GPT.layers * (2 * 2 * GPT.hidden + 2 * GPT.hidden) + GPT.positions * GPT.hidden + 2 * GPT.hidden
    sp_grads = 2 * share * 2 * replicated
    expected = share * (8 * GPT.layers * S + 4 * S) + 2 * share * 12 * tokens + sp_grads
    assert with_sp.ranks[0]["bytes_sent"] == expected
    # the activations' traffic is the all-reduces' volume, split in two
    assert with_sp.ranks[0]["bytes_sent"] - sp_grads == without.ranks[0]["bytes_sent"]
    plan = build_plan(scenario)
    reduced = [op.payload for op in plan.programs[0].ops if isinstance(op, Collective) and op.op == "allreduce"]
    assert {p.split(" mb")[0] for p in reduced} == {"logits max", "cross-entropy sums", "sequence-parallel grads"}


def test_sequence_parallel_splits_activations_as_korthikanti():
    s, b, h, a, t = GPT.seq, 2, GPT.hidden, GPT.heads, 4
    assert GPT.layer_activation_bytes(b, "none", tp=t, sequence_parallel=True) == pytest.approx(
        s * b * h * (34 / t + 5 * a * s / (h * t)))
    assert GPT.layer_activation_bytes(b, "selective", tp=t, sequence_parallel=True) == pytest.approx(
        s * b * h * 34 / t)
    with_sp = simulate(make_scenario(GPT, "tp", t, micro_batch=b, sequence_parallel=True), check_oom=False)
    without = simulate(make_scenario(GPT, "tp", t, micro_batch=b), check_oom=False)
    assert with_sp.ranks[0]["memory"]["activations"] < without.ranks[0]["memory"]["activations"]


def test_sequence_parallel_needs_tensor_parallelism():
    with pytest.raises(SimparError, match="--sequence-parallel"):
        make_scenario(GPT, "ddp", 2, sequence_parallel=True)


def test_tp_comm_overlap_hides_backward_communication_and_keeps_bytes():
    plain = simulate(make_scenario(GPT, "tp", 4), check_oom=False)
    overlap = simulate(make_scenario(GPT, "tp", 4, tp_comm_overlap=True), check_oom=False)
    assert overlap.step_time_s < plain.step_time_s
    assert overlap.ranks[0]["bytes_sent"] == plain.ranks[0]["bytes_sent"]


def test_fp32_main_gradients_make_18_bytes_per_parameter():
    llama = model("llama2-7b")
    result = simulate(make_scenario(llama, "ddp", 1, grad_accum_dtype="fp32"), check_oom=False)
    memory = result.ranks[0]["memory"]
    assert memory["params"] + memory["grads"] + memory["optimizer"] == 18 * llama.params
    default = simulate(make_scenario(llama, "ddp", 1), check_oom=False).ranks[0]["memory"]
    assert default["params"] + default["grads"] + default["optimizer"] == 16 * llama.params
    with pytest.raises(SimparError, match="--grad-accum-dtype"):
        make_scenario(llama, "ddp", 1, grad_accum_dtype="fp64")


def test_megatron_reduces_fp32_gradients_in_fp32():
    scenario = make_scenario(GPT, "3d", 4, tp=2, dp=2, grad_accum_dtype="fp32")
    reductions = [op for op in build_plan(scenario).programs[0].ops
                  if isinstance(op, Collective) and op.payload == "grads"]
    assert reductions and all(op.itemsize == 4 for op in reductions)


def test_mfu_is_megatrons_formula(capsys):
    gpt = ModelSpec("gpt", layers=4, hidden=1024, heads=16, ffn=4096, vocab=51200, seq=2048)
    scenario = make_scenario(gpt, "ddp", 8, micro_batch=2)
    B, s, L, h, V = scenario.train.global_batch, gpt.seq, gpt.layers, gpt.hidden, gpt.vocab
    assert model_flops(scenario) == pytest.approx(72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)))
    result = simulate(scenario)
    assert result.flops["mfu"] == pytest.approx(model_flops(scenario) / (result.step_time_s * 8) / 312e12)
    assert main(["run", "--strategy", "ddp", "--gpus", "8", "--model", "gpt2", "--json", "-"]) == 0
    sim = json.loads(capsys.readouterr().out)["sim"]
    assert 0 < sim["mfu"] <= sim["hfu"] < 1 and sim["model_flops_per_gpu_s"] > 0
    assert main(["run", "--strategy", "ddp", "--gpus", "8", "--model", "gpt2", "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "HFU" in out


def test_published_suite_reports_and_skips(tmp_path, capsys):
    cases = [c for c in published.load() if c["set"] == "C"][:2]
    bad_preset = {**cases[0], "id": "bad-preset", "hardware": "dgx-z900"}
    bad_layout = {**[c for c in published.load() if c["set"] == "B"][0], "id": "bad-layout",
                  "layout": {"tp": 5, "pp": 1, "gpus": 5}}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"cases": cases + [bad_preset, bad_layout]}))
    assert main(["validate", "--published", str(path), "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["summary"]["cases"] == 2
    assert [s["id"] for s in result["summary"]["skipped"]] == ["bad-preset", "bad-layout"]
    assert "--topology: unknown preset" in result["summary"]["skipped"][0]["why"]
    assert "--tp" in result["summary"]["skipped"][1]["why"]
    for row in result["cases"][:2]:
        assert row["error"] == pytest.approx((row["simulated"] - row["measured"]) / row["measured"])
    assert main(["validate", "--published", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bad-preset" in out and "skipped" in out and "mean |error|" in out


def test_published_file_names_every_source():
    cases = published.load()
    assert {c["set"] for c in cases} == {"A", "B", "C", "D", "E"}
    assert set(published.REFEREE_SETS) == {"A", "B", "C", "D"}  # E (FP8 tables, recipes assumed) apart
    assert all(c["source"] and c["quantity"] in published.QUANTITIES and c["measured"] > 0 for c in cases)
    fp8 = [c for c in cases if c.get("precision") == "fp8-mixed"]
    assert {c["hardware"] for c in fp8} >= {"dgx-h100", "dgx-b200", "examples/clusters/gb200-nvl72.yaml"}


def test_tokens_per_gpu_is_the_global_batch_over_the_step_and_gpus(monkeypatch):
    """A case's tokens per second per GPU is batch x sequence / (step x GPUs); its cluster file, named relative to
    the source tree, is found from any working directory."""
    case = next(c for c in published.load() if c["id"] == "E-GB200-llama3-8b")
    seen = []
    monkeypatch.setattr(published, "step_time", lambda c, exact=False: seen.append(c) or 2.0)
    tokens = published.simulate_case(case)
    assert tokens == case["batch"] * case["model"]["seq"] / (2.0 * case["layout"]["gpus"]) and seen == [case]
    monkeypatch.chdir("/")
    scenario = published._scenario(case)
    assert scenario.cluster.topology.endswith("examples/clusters/gb200-nvl72.yaml")
    topology = topologies.build(scenario.cluster.topology, 8)
    assert topology.graph.nodes[topology.gpus[0]]["spec"].name == "gb200"


def test_deepspeed_grad_accum_dtype_is_read(tmp_path, capsys):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                  "zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "fp32"}}))
    assert main(["run", "--deepspeed", str(config), "--gpus", "8", "--model", "gpt2", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["strategy"]["grad_accum_dtype"] == "fp32"
    assert not any("data_types" in line for line in out["inputs"])  # read, not listed as unmodelled
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "data_types": {"grad_accum_dtype": "fp8"}}))
    assert main(["run", "--deepspeed", str(config), "--gpus", "8"]) == 2
    assert "data_types.grad_accum_dtype" in capsys.readouterr().err


def test_gpt3_175b_fits_64_a100s_with_sequence_parallelism():
    """Korthikanti et al. train GPT-3 175B on 64 A100-80GB (TP 8 x PP 8, selective recomputation,
    sequence parallelism); simpar's memory walk must agree that it fits."""
    from simpar.sim.tracker import walk

    scenario = make_scenario(model("gpt3-175b"), "3d", 64, tp=8, pp=8, micro_batch=1, global_batch=64,
                             recompute="selective", sequence_parallel=True, grad_accum_dtype="fp32")
    peak = max(walk(p).peak["gpu"] for p in build_plan(scenario).programs)
    assert peak < A100.memory_bytes
    without = make_scenario(model("gpt3-175b"), "3d", 64, tp=8, pp=8, micro_batch=1, global_batch=64,
                            recompute="selective", grad_accum_dtype="fp32")
    assert max(walk(p).peak["gpu"] for p in build_plan(without).programs) > peak
