"""fp8-mixed (Transformer Engine): the layers' linear GEMMs at the FP8 peak, their inputs kept in FP8, FP8 weight
copies held, amaxes reduced over the stage; refused where FP8 does not exist."""

from dataclasses import replace

import pytest

from simpar.cli import main
from simpar.costs.kernels import Shape, unit_kernels
from simpar.errors import SimparError
from simpar.flops import model_flops
from simpar.models import model
from simpar.plan import Alloc, Collective
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.strategies import build_plan

LLAMA = model("llama2-7b")


def _scenario(precision="fp8-mixed", device="h100-sxm", **options):
    options = {"tp": 2, "pp": 2, "sequence_parallel": True, "flash_attention": True, **options}
    return make_scenario(LLAMA, "3d", 8, topology="dgx-h100", device=device, precision=precision, microbatches=4,
                         **options)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activations_keep_the_linear_gemms_inputs_in_fp8(recompute):
    """Per layer: s·b·h·(2/t + (1 + f/h)/t) bytes fewer with sequence parallelism (full recomputation: none)."""
    t, s, h, f = 2, LLAMA.seq, LLAMA.hidden, LLAMA.ffn
    args = (1, recompute, True, t, True)
    saved = LLAMA.layer_activation_bytes(*args) - LLAMA.layer_activation_bytes(*args, fp8=True)
    assert saved == (0 if recompute == "full" else s * h * (2 / t + (1 + f / h) / t))


def test_fp8_weights_and_their_transposes_are_held_as_buffers():
    """2 bytes per linear weight element of the stage's layers (an FP8 copy and its transpose)."""
    plan = build_plan(_scenario())
    h, kv, f = LLAMA.hidden, LLAMA.kv_dim, LLAMA.ffn
    linear = h * (h + 2 * kv) + h * h + 2 * h * f + f * h  # SwiGLU: up and gate
    for prog in plan.programs:
        fp8 = [op.nbytes for op in prog.ops if isinstance(op, Alloc) and op.payload == "fp8 weights"]
        assert fp8 == [2 * linear // 2 * (LLAMA.layers // 2)]  # tp 2, 16 layers a stage
    bf16 = build_plan(_scenario("bf16-mixed"))
    assert not [op for prog in bf16.programs for op in prog.ops if getattr(op, "payload", "") == "fp8 weights"]


def test_amaxes_are_reduced_over_the_stage_once_a_forward_and_once_a_backward():
    scenario = _scenario(dp=2)
    plan = build_plan(scenario)
    prog = plan.programs[0]
    amax = [op for op in prog.ops if isinstance(op, Collective) and "amax" in op.payload]
    layers, m = LLAMA.layers // 2, scenario.microbatches
    assert sorted(op.nbytes for op in amax) == [16 * layers] * m + [32 * layers] * m
    assert {op.group for op in amax} == {"stage"} and plan.groups(prog, "stage") == [prog.ranks]


def test_the_linear_gemms_run_at_the_fp8_peak_and_nothing_else_does():
    fp8 = Shape.of(_scenario())
    for phase in ("fwd", "bwd"):
        kernels = unit_kernels(fp8, "layer", phase)
        names = {k.name.split(" dgrad")[0].split(" wgrad")[0] for k in kernels if getattr(k, "fp8", False)}
        assert names == {"qkv", "attention output", "mlp up", "mlp down"}
        assert not any(getattr(k, "fp8", False) for k in unit_kernels(fp8, "head", phase))
    assert not any(getattr(k, "fp8", False) for k in unit_kernels(Shape.of(_scenario("bf16-mixed")), "layer", "fwd"))


@pytest.mark.parametrize("device", ["h100-sxm", "h200", "b200", "gb200"])
def test_fp8_is_faster_than_bf16_and_mfu_is_reported_against_both_peaks(device):
    fp8, bf16 = simulate(_scenario(device=device)), simulate(_scenario("bf16-mixed", device=device))
    assert fp8.step_time_s < bf16.step_time_s
    from simpar.devices.presets import gpu

    per_gpu = model_flops(_scenario(device=device)) / (fp8.step_time_s * 8)
    assert fp8.flops["mfu"] == pytest.approx(per_gpu / gpu(device).bf16_flops)
    assert fp8.flops["mfu_fp8"] == pytest.approx(per_gpu / gpu(device).fp8_flops)
    assert "mfu_fp8" not in bf16.flops


@pytest.mark.parametrize("args,message", [
    (["--strategy", "3d", "--gpus", "8", "--model", "llama2-7b"], "--precision: fp8-mixed needs FP8 tensor cores"),
    (["--strategy", "zero2", "--gpus", "8", "--topology", "dgx-h100"], "--precision: fp8-mixed is Transformer Engine's"),
    (["--strategy", "3d", "--gpus", "8", "--topology", "dgx-h100", "--model", "mixtral-8x7b"],
     "--precision: fp8-mixed is Transformer Engine's"),
])
def test_fp8_is_refused_in_one_line_where_it_does_not_exist(capsys, args, message):
    assert main(["run", "--precision", "fp8-mixed", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"simpar: error: {message}") and "\n" not in err, err


def test_simpar_memory_sends_fp8_to_the_simulated_step(capsys):
    assert main(["memory", "--model", "llama2-7b", "--precision", "fp8-mixed"]) == 2
    assert "--precision: fp8-mixed memory is priced by the simulated step" in capsys.readouterr().err


def test_the_cli_explains_the_gain_over_bf16(capsys):
    assert main(["run", "--precision", "fp8-mixed", "--strategy", "3d", "--gpus", "8", "--tp", "8", "--topology",
                 "dgx-h100", "--model", "llama2-7b", "--flash-attention"]) == 0
    out = capsys.readouterr().out
    assert "of the bf16 peak" in out and "of the FP8 peak" in out
    assert "vs bf16-mixed: step" in out and "at the FP8 peak (2.0x bf16's)" in out and "FP8 weights" in out


def test_the_executor_refuses_fp8():
    from simpar.real.support import check_supported

    scenario = make_scenario(model("tiny-deep"), "3d", 2, pp=2, precision="fp8-mixed")
    with pytest.raises(SimparError, match="--precision: the executor does not run FP8"):
        check_supported(replace(scenario))
