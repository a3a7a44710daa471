"""The simulator predicts the activations of the implementation at hand: on the executor's machine
(cpu-host) what simpar's own GPT saves for backward, elsewhere Megatron's (Korthikanti et al. 2022)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from simpar.cli import main
from simpar.models import model
from simpar.real.instrument import SavedActivations
from simpar.real.model import build_model
from simpar.scenario import make_scenario
from simpar.strategies.work import Work

BASE = model("tiny")
SPECS = {"tiny": BASE, "small": model("small"), "tiny-deep": model("tiny-deep"),
         "swiglu-rmsnorm-gqa": dataclasses.replace(BASE, name="v", activation="swiglu", norm="rmsnorm", kv_heads=2,
                                                   positions=0, bias=False, tied_embeddings=False)}


def saved_per_unit(spec, b: int, dtype) -> list[int]:
    """Bytes each unit's forward (the head's with its loss) leaves for backward, by saved-tensor hooks."""
    net = build_model(spec).to(dtype)
    acts = SavedActivations(net.parameters())
    ids = torch.randint(0, spec.vocab, (b, spec.seq))
    targets = torch.randint(0, spec.vocab, (b, spec.seq))
    x, kept, out = ids, [], []
    for u, unit in enumerate(net.units):
        if u:
            x = x.detach().requires_grad_(True)
        before = acts.nbytes
        with acts.hooks((u,)):
            x = unit(x)
            if u == len(net.units) - 1:
                x = F.cross_entropy(x.float().reshape(-1, x.shape[-1]), targets.reshape(-1))
        kept.append(x)  # (keeps the graph, so no saved storage is freed and reused)
        out.append(acts.nbytes - before)
    return out


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("b", [1, 2])
def test_each_unit_as_the_executor_saves_it(name, dtype, b):
    spec, w = SPECS[name], 4 if dtype == torch.float32 else 2
    measured = saved_per_unit(spec, b, dtype)
    predicted = [spec.executor_activation_bytes("embedding", b, w), spec.executor_activation_bytes("layer", b, w),
                 spec.executor_activation_bytes("head", b, w)]
    # the embedding exactly; a layer within 1 % (GELU/LayerNorm) or 10 % (torch's composite RMSNorm keeps
    # fp32 intermediates in bf16, not modelled); the head within 2 %
    assert predicted[0] == measured[0]
    assert predicted[1] == pytest.approx(measured[1], rel=0.01 if spec.norm == "layernorm" else 0.10)
    assert predicted[2] == pytest.approx(measured[-1], rel=0.02)


def test_the_implementation_follows_the_machine():
    cpu = Work(make_scenario(BASE, "ddp", 2, topology="cpu-host", precision="fp32"))
    gpu = Work(make_scenario(BASE, "ddp", 2, topology="dgx-a100", precision="fp32"))
    assert cpu.executor_activations and not gpu.executor_activations
    assert cpu.units[1].activations == BASE.executor_activation_bytes("layer", 1, 4)
    assert gpu.units[1].activations == BASE.layer_activation_bytes(1) * 2  # Korthikanti's 16-bit count, in fp32


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "dp", "zero1", "zero2", "zero3", "zero2-offload", "pp", "tp"])
@pytest.mark.parametrize("name", ["tiny-deep", "small"])
def test_compare_real_activations_within_5_percent(capsys, name, strategy):
    if strategy == "pp" and MODELS_TIED(name):
        pytest.skip("the executor does not split a tied embedding across pipeline stages")
    assert main(["run", "--strategy", strategy, "--gpus", "2", "--model", name, "--compare-real", "--steps", "2",
                 "--json", "-"]) == 0
    import json

    row = json.loads(capsys.readouterr().out)["comparison"]["memory"]["activations"]
    assert row["sim"] == pytest.approx(row["real"], rel=0.05)


def MODELS_TIED(name: str) -> bool:  # noqa: N802
    return model(name).tied_embeddings
