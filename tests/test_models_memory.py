import json

import pytest

from simpar import SimparError
from simpar.memory import model_states
from simpar.models import ModelSpec, model
from simpar.train import TrainSpec

# Published parameter counts (Hugging Face checkpoints).
PUBLISHED = {
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
    "llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name, count", PUBLISHED.items())
def test_parameter_counts_match_the_published_checkpoints(name, count):
    assert model(name).params == count


def test_gpt3_is_175b_and_the_small_presets_are_small():
    assert 174e9 < model("gpt3-175b").params < 176e9
    assert model("tiny").params < model("small").params < 2_000_000


def test_forward_flops_follow_megatron_for_a_gpt_layer():
    m, b = model("gpt2-xl"), 4
    s, h = m.seq, m.hidden
    assert m.layer_forward_flops(b) == 24 * b * s * h * h + 4 * b * s * s * h


def test_activation_bytes_follow_korthikanti():
    m, b = model("gpt2"), 2
    s, h, a = m.seq, m.hidden, m.heads
    assert m.layer_activation_bytes(b) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert m.layer_activation_bytes(b, "selective") == pytest.approx(34 * s * b * h)
    assert m.layer_activation_bytes(b, flash_attention=True) == pytest.approx(34 * s * b * h)
    assert m.layer_activation_bytes(b, "full") == 2 * s * b * h


def test_bad_model_shapes_are_clear_errors():
    with pytest.raises(SimparError, match="not divisible by heads"):
        ModelSpec("odd", layers=1, hidden=10, heads=3, ffn=4, vocab=8, seq=4)
    with pytest.raises(SimparError, match="--model: unknown preset 'gpt5'"):
        model("gpt5")


@pytest.mark.parametrize("n", [1, 8, 64])
def test_model_states_follow_the_zero_formulas(n):
    phi = 7_500_000_000
    total = {s: model_states(s, phi, n).total for s in ("ddp", "zero1", "zero2", "zero3")}
    assert total["ddp"] == 16 * phi
    assert total["zero1"] == pytest.approx(4 * phi + 12 * phi / n)
    assert total["zero2"] == pytest.approx(2 * phi + 14 * phi / n)
    assert total["zero3"] == pytest.approx(16 * phi / n)


def test_offload_moves_the_optimizer_to_the_host():
    phi, n = 10**9, 4
    on_gpu, offloaded = model_states("zero2", phi, n), model_states("zero2-offload", phi, n)
    # the host holds the optimizer states plus the 16-bit gradient shard copied down for the CPU's step
    assert offloaded.optimizer == 0 and offloaded.host == on_gpu.optimizer + 2 * phi / n == 14 * phi / n
    fp32 = model_states("zero2-offload", phi, n, TrainSpec(precision="fp32"))
    assert fp32.host == (8 + 4 + 4) * phi / n  # m and v, the fp32 gradient shard, the CPU's parameter copy


def test_precision_and_optimizer_change_the_bytes_per_parameter():
    assert TrainSpec(precision="fp32").optimizer_bytes == 8
    assert TrainSpec(optimizer="sgd-momentum").optimizer_bytes == 8
    assert model_states("ddp", 100, 1, TrainSpec(precision="fp32", optimizer="sgd")).total == 800
    with pytest.raises(SimparError, match="--global-batch: 10 is not divisible"):
        TrainSpec(global_batch=10, micro_batch=2).grad_accumulation(dp=4)


def test_models_and_memory_cli(cli):
    listing = json.loads(cli("models", "--json", "-").stdout)
    rows = {row["name"]: row for row in listing}
    assert rows["llama2-7b"] == {"name": "llama2-7b", "params": 6_738_415_616, "active_params": 6_738_415_616,
                                 "experts": 0, "top_k": 0}
    assert (rows["mixtral-8x7b"]["params"], rows["mixtral-8x7b"]["active_params"]) == (46_702_792_704, 12_879_925_248)
    out = cli("memory", "--params", "7.5e9", "--strategy", "zero1", "--gpus", "64", "--json", "-")
    per_gpu = json.loads(out.stdout)["per_gpu"]
    assert per_gpu["total"] == pytest.approx(4 * 7.5e9 + 12 * 7.5e9 / 64)
    assert set(per_gpu) >= {"params", "grads", "optimizer", "activations", "total"}
    bad = cli("memory", "--strategy", "zero9")
    assert bad.returncode == 2 and "--strategy" in bad.stderr and "Traceback" not in bad.stderr
