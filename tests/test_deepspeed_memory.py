"""Model states as DeepSpeed holds them: simpar's count (fp32 gradient partitions, ZeRO-3's largest module
gathered, offloaded optimizer and parameters in host memory) equals DeepSpeed's own estimators, and the
simulated step under --deepspeed holds the same states."""

from __future__ import annotations

import json

import pytest

from simpar.cli import main
from simpar.deepspeed import read_config
from simpar.memory import largest_module, model_states
from simpar.models.presets import PRESETS as MODELS
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.train import TrainSpec

MIXED = TrainSpec(precision="bf16-mixed")
# (model, GPUs per node, nodes): sizes from 125M to 13B parameters, one to 64 GPUs
SHAPES = [("gpt2", 1, 1), ("gpt2-xl", 8, 1), ("llama2-7b", 8, 2), ("llama2-13b", 8, 8), ("llama3-8b", 4, 2),
          ("gpt2-medium", 2, 3)]


def states(strategy, name, gpus, offload_params=False):
    spec = MODELS[name]
    return model_states(strategy, spec.params, gpus, MIXED, deepspeed_habits=True, offload_params=offload_params,
                        largest_module=largest_module(spec))


def on_gpu(memory):
    return memory.params + memory.grads + memory.optimizer + memory.working


@pytest.fixture(scope="module")
def estimators():
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2",
                                 reason="deepspeed not installed: pip install 'simpar[deepspeed]'")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    return stage2.estimate_zero2_model_states_mem_needs, stage3.estimate_zero3_model_states_mem_needs


@pytest.mark.parametrize("name,per_node,nodes", SHAPES)
@pytest.mark.parametrize("offload", [False, True], ids=["on-gpu", "offload"])
def test_zero2_equals_deepspeeds_estimator(estimators, name, per_node, nodes, offload):
    estimate2, _ = estimators
    phi, gpus = MODELS[name].params, per_node * nodes
    _, gpu = estimate2(phi, per_node, nodes, cpu_offload=offload, additional_buffer_factor=1.0)
    assert on_gpu(states("zero2-offload" if offload else "zero2", name, gpus)) == gpu


@pytest.mark.parametrize("name,per_node,nodes", SHAPES)
@pytest.mark.parametrize("offload", ["none", "optimizer", "optimizer+params"])
def test_zero3_equals_deepspeeds_estimator(estimators, name, per_node, nodes, offload):
    _, estimate3 = estimators
    spec, gpus = MODELS[name], per_node * nodes
    cpu, gpu, largest = estimate3(spec.params, largest_module(spec), per_node, nodes, cpu_offload=offload != "none",
                                  cpu_offload_params=offload == "optimizer+params", zero_init=True,
                                  additional_buffer_factor=1.0)
    memory = states("zero3" if offload == "none" else "zero3-offload", name, gpus, offload == "optimizer+params")
    # ZeRO-3's engine keeps its 16-bit gradient partition (stage3.py grad_partitions_flat_buffer) beside the fp32
    # copy it makes for the step: 2 bytes a parameter over N the estimator's 18 leaves out (measured with
    # --engine deepspeed, tests/test_deepspeed_engine.py); with offload that buffer is not on the GPU
    extra = 2 * spec.params / gpus if offload == "none" else 0
    assert on_gpu(memory) == pytest.approx(gpu + extra, abs=1) and memory.working == largest  # DeepSpeed rounds
    if offload != "none":  # in host memory per node: fp32 master, moments and gradients (+ 16-bit parameters),
        # and the 16-bit gradient partition buffer the estimator leaves out (measured, as on the GPU above)
        assert memory.host * per_node == pytest.approx(cpu + 2 * spec.params / nodes, abs=per_node)


def test_zero2_offload_host_memory_differs_from_the_estimators_startup_figure(estimators):
    """DeepSpeed's ZeRO-2 estimator puts max(4 x all GPUs, 16) bytes per parameter on each node's CPU: every
    process loading the fp32 model at start-up. simpar counts the training state: 16 bytes a parameter
    (fp32 master, Adam moments, fp32 gradients) split over the nodes."""
    estimate2, _ = estimators
    spec = MODELS["llama2-7b"]
    cpu, _ = estimate2(spec.params, 8, 2, cpu_offload=True, additional_buffer_factor=1.0)
    assert cpu == spec.params * 4 * 16
    assert states("zero2-offload", "llama2-7b", 16).host * 8 == 16 * spec.params / 2


def test_largest_module_is_deepspeeds(estimators):
    """The largest module as DeepSpeed finds it on simpar's real GPT (parameters of a module itself)."""
    torch = pytest.importorskip("torch")
    from simpar.real.model import GPT

    for name in ("tiny", "small", "tiny-deep"):
        spec = MODELS[name]
        module = GPT(spec)
        theirs = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules())
        assert largest_module(spec) == theirs, name
        assert isinstance(module, torch.nn.Module)


@pytest.mark.parametrize("config,strategy", [
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, "zero2"),
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}, "zero3"),
    ({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                       "offload_param": {"device": "cpu"}}}, "zero3-offload"),
])
def test_a_simulated_step_holds_deepspeeds_model_states(config, strategy):
    spec, gpus = MODELS["gpt2-xl"], 8
    ds = read_config(config, spec, gpus)
    assert ds.strategy == strategy and ds.options["deepspeed_habits"]
    scenario = make_scenario(spec, ds.strategy, gpus, precision=ds.precision, recompute="full", **ds.options)
    memory = simulate(scenario).ranks[0]["memory"]
    expected = states(strategy, "gpt2-xl", gpus, ds.options.get("offload_params", False))
    assert (memory["params"], memory["grads"], memory["optimizer"]) == pytest.approx(
        (expected.params, expected.grads, expected.optimizer), abs=gpus)  # whole bytes per shard
    assert memory["host"] == pytest.approx(expected.host, abs=3 * gpus)


def test_simpar_memory_deepspeed_command(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}))
    assert main(["memory", "--deepspeed", str(path), "--model", "llama2-7b", "--gpus", "16", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_states_per_gpu"] == on_gpu(states("zero3", "llama2-7b", 16))
    assert main(["memory", "--deepspeed", str(path), "--strategy", "zero2"]) == 2
    assert "leave --strategy out" in capsys.readouterr().err
