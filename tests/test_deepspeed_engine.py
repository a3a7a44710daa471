"""`--compare-real --engine deepspeed`: DeepSpeed itself trains the same model on gloo ranks beside the
simulation (priced with DeepSpeed's habits) and simpar's executor."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from simpar.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="deepspeed not installed: pip install 'simpar[deepspeed]'")


def run(tmp_path, capsys, gpus, zero, precision="fp32"):
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "zero_optimization": zero,
              "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
              "bf16": {"enabled": precision == "bf16-mixed"}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert main(["run", "--deepspeed", str(path), "--gpus", str(gpus), "--compare-real", "--engine", "deepspeed",
                 "--steps", "3", "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


CASES = [(2, {"stage": 1}, "fp32"), (2, {"stage": 2}, "fp32"), (2, {"stage": 3}, "fp32"),
         (4, {"stage": 3}, "bf16-mixed"), (2, {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "bf16-mixed"),
         (2, {"stage": 3, "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 200},
          "bf16-mixed")]


@pytest.mark.slow
@pytest.mark.parametrize("gpus,zero,precision", CASES,
                         ids=["zero1", "zero2", "zero3", "zero3-4ranks-bf16", "zero2-offload-bf16",
                              "zero3-offload-bf16-norms-persistent"])
def test_deepspeed_beside_the_simulation(tmp_path, capsys, gpus, zero, precision):
    out = run(tmp_path, capsys, gpus, zero, precision)
    ds = out["deepspeed"]
    # the same training: DeepSpeed's losses are simpar's executor's (bf16: to its rounding)
    assert ds["loss_max_abs_diff_vs_executor"] < (1e-5 if precision == "fp32" else 1e-3)
    c = ds["comparison"]
    # bytes: equal but for DeepSpeed's few bytes of bookkeeping collectives (grad norm, a broadcast)
    assert c["bytes_sent"]["error"] == pytest.approx(0, abs=0.01)
    for category in ("params", "optimizer", "host"):
        row = c[category]
        assert row["sim"] == pytest.approx(row["real"], rel=0.05), category
    if zero["stage"] == 3 or precision == "fp32":  # ZeRO-1/2 bf16: the fp32 copy is made inside step() (listed)
        assert c["grads"]["sim"] == pytest.approx(c["grads"]["real"], rel=0.05)
    assert any("optimizer: the config's replaced" in line for line in ds["differences"])
    assert any("gradient_clipping: off" in line for line in ds["differences"])


@pytest.mark.slow
def test_a_config_the_executor_cannot_run_goes_to_deepspeed_alone(capsys):
    """The HF ZeRO-3 template offloads parameters, which simpar's executor does not perform: DeepSpeed runs
    alone beside the simulation, its losses held to one process on the whole batch."""
    template = str(Path(__file__).resolve().parents[1] / "examples" / "configs" / "hf_zero3_offload.json")
    assert main(["run", "--deepspeed", template, "--gpus", "2", "--compare-real", "--engine", "deepspeed",
                 "--json", "-"]) == 0
    ds = json.loads(capsys.readouterr().out)["deepspeed"]
    assert ds["losses_against"] == "one process on the whole batch" and ds["loss_max_abs_diff_vs_executor"] < 1e-3
    c = ds["comparison"]
    assert c["bytes_sent"]["error"] == pytest.approx(0, abs=0.01)
    assert c["host"]["sim"] == c["host"]["real"] and c["params"]["real"] == c["params"]["sim"] == 0


def test_engine_deepspeed_needs_the_config_and_a_real_run(tmp_path, capsys):
    assert main(["run", "--engine", "deepspeed"]) == 2
    assert "give --deepspeed CONFIG and --compare-real" in capsys.readouterr().err
    assert main(["run", "--engine", "megatron"]) == 2
    assert "--engine: must be simpar or deepspeed" in capsys.readouterr().err
