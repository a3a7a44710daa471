"""--deepspeed ds_config.json: DeepSpeed settings read into the simulation, nothing dropped silently."""

import json
from pathlib import Path

import pytest

from simpar.cli import main
from simpar.deepspeed import filled, read_config
from simpar.errors import SimparError
from simpar.models import model
from simpar.models.presets import PRESETS as MODELS

GPT2 = model("gpt2")


def read(config, dp=8, model=GPT2, **flags):
    return read_config(config, model, dp, **flags)


@pytest.mark.parametrize("zero, strategy", [
    ({}, "ddp"), ({"stage": 0}, "ddp"), ({"stage": 1}, "zero1"), ({"stage": 2}, "zero2"), ({"stage": 3}, "zero3"),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zero2-offload"),
    ({"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, "zero3-offload"),
    ({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}, "zero3-infinity"),
    ({"stage": 3, "offload_param": {"device": "nvme"}}, "zero3-infinity"),
    ({"stage": 2, "offload_optimizer": {"device": "none"}}, "zero2"),
])
def test_stage_and_offload_pick_the_strategy(zero, strategy):
    assert read({"zero_optimization": zero, "train_micro_batch_size_per_gpu": 1}).strategy == strategy


@pytest.mark.parametrize("zero, message", [
    ({"stage": 4}, "stage must be 0, 1, 2 or 3"),
    ({"stage": 2, "offload_param": {"device": "cpu"}}, "offload_param needs zero_optimization.stage 3"),
    ({"stage": 2, "offload_optimizer": {"device": "nvme"}}, "needs zero_optimization.stage 3"),
    ({"stage": 1, "offload_optimizer": {"device": "cpu"}}, "stage 2 or 3"),
    ({"stage": 2, "offload_optimizer": {"device": "gpu"}}, "device must be none, cpu or nvme"),
    ({"stage": "two"}, "stage must be a whole number"),
])
def test_impossible_zero_settings(zero, message):
    with pytest.raises(SimparError, match=message):
        read({"zero_optimization": zero})


def test_batch_sizes_solve_for_the_missing_or_auto_one():
    full = read({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})
    assert (full.micro_batch, full.microbatches, full.global_batch, full.resolved) == (2, 4, 64, {})
    auto = read({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto"})
    assert (auto.microbatches, auto.resolved) == (4, {"gradient_accumulation_steps": 4})
    micro = read({"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})
    assert (micro.micro_batch, micro.resolved) == (4, {"train_micro_batch_size_per_gpu": 4})
    total = read({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2})
    assert (total.global_batch, total.resolved) == (48, {"train_batch_size": 48})
    from_flags = read({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}, micro_flag=2)
    assert (from_flags.micro_batch, from_flags.microbatches, from_flags.global_batch) == (2, 1, 16)
    with pytest.raises(SimparError, match=r"train_batch_size 60 != .* 2 x .* 4 x .* 8 = 64"):
        read({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})


def test_precision_from_fp16_and_bf16():
    assert read({"bf16": {"enabled": True}}).precision == "bf16-mixed"
    assert read({"fp16": {"enabled": True, "loss_scale": 0}}).precision == "fp16-mixed"
    assert read({"fp16": {"enabled": False}}).precision == "fp32"
    assert read({}).precision == "fp32"  # DeepSpeed trains in fp32 unless told otherwise
    auto = read({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}, precision_flag="fp16-mixed")
    assert auto.precision == "fp16-mixed"
    assert auto.resolved["fp16.enabled"] is True and auto.resolved["bf16.enabled"] is False
    with pytest.raises(SimparError, match="both true"):
        read({"bf16": {"enabled": True}, "fp16": {"enabled": True}})
    with pytest.raises(SimparError, match="--precision: the DeepSpeed config trains in bf16-mixed, not fp32"):
        read({"bf16": {"enabled": True}}, precision_flag="fp32")


def test_buckets_prefetch_overlap_and_optimizer():
    ds = read({"bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
               "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e7, "overlap_comm": False,
                                     "stage3_prefetch_bucket_size": 3 * GPT2.layer_params() + 1}})
    assert ds.options == {"bucket_bytes": 2 * 50_000_000, "prefetch": 3, "overlap_comm": False,
                          "max_reuse_distance": 1_000_000_000,  # DeepSpeed's defaults for the ZeRO-3 knobs
                          "param_persistence_threshold": 100_000, "max_live_parameters": 1_000_000_000,
                          "sub_group_size": 1_000_000_000,
                          "deepspeed_habits": True}  # bf16: the optimizer's fp32 copy of its gradients
    assert ds.optimizer == "adamw"
    auto = read({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                       "stage3_prefetch_bucket_size": "auto"}})
    assert auto.resolved["reduce_bucket_size"] == 768 * 768  # as the HF Trainer fills it: hidden^2
    assert auto.options["bucket_bytes"] == 4 * 768 * 768  # fp32 gradients
    assert auto.resolved["stage3_prefetch_bucket_size"] == int(0.9 * 768 * 768)
    assert auto.options["prefetch"] == 0  # 0.9 h^2 elements hold less than one GPT-2 layer (~12 h^2)
    sgd = read({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})
    assert sgd.optimizer == "sgd-momentum"
    with pytest.raises(SimparError, match="optimizer.type 'Lamb'"):
        read({"optimizer": {"type": "Lamb"}})


def test_unmodelled_and_unknown_keys_are_reported():
    ds = read({"gradient_clipping": 1.0, "steps_per_print": 10, "train_batch_sise": 8,
               "zero_optimization": {"stage": 2, "contiguous_gradients": True, "allgather_bucket_size": 5e8,
                                     "reduce_scater": True}})
    assert "gradient_clipping" in ds.ignored and "steps_per_print" in ds.ignored
    assert any(k.startswith("zero_optimization.allgather_bucket_size (") for k in ds.ignored)
    assert "zero_optimization.contiguous_gradients" in ds.ignored
    assert ds.unknown == ["train_batch_sise", "zero_optimization.reduce_scater"]
    report = "\n".join(ds.report())
    assert "train_batch_sise" in report and "gradient_clipping" in report


def test_run_with_a_deepspeed_config(tmp_path, capsys):
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True,
                                                                 "reduce_bucket_size": "auto"},
              "wall_clock_breakdown": False, "mystery": 1}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    assert main(["run", "--deepspeed", str(path), "--model", "gpt2", "--gpus", "8", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["strategy"]["name"] == "zero2"
    assert out["scenario"]["train"]["global_batch"] == 32 and out["scenario"]["microbatches"] == 2
    assert out["scenario"]["strategy"]["bucket_bytes"] == 2 * 768 * 768
    text = "\n".join(out["inputs"])
    assert "train_batch_size=32" in text and "mystery" in text and "wall_clock_breakdown" in text
    assert main(["run", "--deepspeed", str(path), "--gpus", "8"]) == 0
    printed = capsys.readouterr().out
    assert "resolved (\"auto\" or not given): train_batch_size=32" in printed and "unknown keys" in printed


def test_overlap_comm_false_exposes_communication(tmp_path, capsys):
    times = {}
    for overlap in (True, False):
        path = tmp_path / f"ds{overlap}.json"
        path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                    "zero_optimization": {"stage": 2, "overlap_comm": overlap,
                                                          "reduce_bucket_size": 5e6}}))
        assert main(["run", "--deepspeed", str(path), "--gpus", "16", "--json", "-"]) == 0
        times[overlap] = json.loads(capsys.readouterr().out)["sim"]["step_time_s"]
    assert times[False] > times[True]


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "zero3"], "--strategy: --deepspeed gives the strategy"),
    (["--tp", "2"], "--tp: --deepspeed gives"),
])
def test_conflicting_flags(tmp_path, capsys, argv, message):
    path = tmp_path / "ds.json"
    path.write_text("{}")
    assert main(["run", "--deepspeed", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert main(["run", "--deepspeed", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["run", "--deepspeed", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad.write_text("[1, 2]")
    assert main(["run", "--deepspeed", str(bad)]) == 2
    assert "must be a JSON object" in capsys.readouterr().err


def test_deepspeed_aliases_and_deprecated_keys():
    old = read({"bfloat16": {"enabled": True}})  # DeepSpeed's old name for bf16 (precision_config.BFLOAT16_OLD)
    assert old.precision == "bf16-mixed" and old.unknown == []
    assert read({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}).precision == "fp32"  # bf16 wins
    short = read({"zero_optimization": {"stage": 3, "max_reuse_distance": 5, "prefetch_bucket_size": 0}})
    assert short.options["max_reuse_distance"] == 5 and short.options["prefetch"] == 0 and short.unknown == []
    with pytest.raises(SimparError, match="stage3_max_reuse_distance twice"):
        read({"zero_optimization": {"stage": 3, "max_reuse_distance": 5, "stage3_max_reuse_distance": 6}})
    legacy = read({"zero_optimization": {"stage": 2, "cpu_offload": True}})
    assert legacy.strategy == "zero2-offload" and legacy.unknown == []


def test_deepspeed_defaults_for_what_a_config_leaves_out():
    ds = read({"zero_optimization": {"stage": 2}})
    assert ds.options == {"bucket_bytes": 4 * 500_000_000, "overlap_comm": False,  # fp32 gradients
                          "deepspeed_habits": True}
    assert ds.defaults == {"reduce_bucket_size": 500_000_000, "overlap_comm": False}
    assert read({"zero_optimization": {"stage": 3}}).options["overlap_comm"] is True
    assert "DeepSpeed's defaults" in "\n".join(ds.report())


TEMPLATES = sorted((Path(__file__).resolve().parents[1] / "examples" / "configs").glob("hf_zero*.json"))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_hf_templates_read_without_unknown_keys(path):
    ds = read(json.loads(path.read_text()), model=MODELS["llama2-7b"], dp=8)
    assert ds.unknown == [] and ds.strategy.endswith("offload")


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
@pytest.mark.parametrize("dp,flags", [(8, {}), (4, {"micro_flag": 2, "global_flag": 64}),
                                      (2, {"precision_flag": "fp16-mixed"})])
def test_resolved_values_equal_deepspeeds_parser(monkeypatch, path, dp, flags):
    config_module = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed not installed: "
                                        "pip install 'simpar[deepspeed]'")
    config = json.loads(path.read_text())
    if "bf16" in config and flags.get("precision_flag") == "fp16-mixed":
        flags = {}
    ds = read(config, model=MODELS["llama2-7b"], dp=dp, **flags)

    class DataParallel:  # DeepSpeed takes the data-parallel world size from an mpu
        def get_data_parallel_world_size(self):
            return dp

    monkeypatch.setattr(config_module.dist, "get_rank", lambda *a, **k: 0)
    parsed = config_module.DeepSpeedConfig(filled(config, ds), mpu=DataParallel())
    zero = parsed.zero_config
    theirs = {"train_batch_size": parsed.train_batch_size,
              "train_micro_batch_size_per_gpu": parsed.train_micro_batch_size_per_gpu,
              "gradient_accumulation_steps": parsed.gradient_accumulation_steps,
              "zero_optimization.stage": int(zero.stage), "fp16.enabled": parsed.float16_config.enabled,
              "bf16.enabled": parsed.bfloat16_config.enabled,
              "zero_optimization.reduce_bucket_size": zero.reduce_bucket_size,
              "zero_optimization.stage3_prefetch_bucket_size": zero.prefetch_bucket_size,
              "zero_optimization.stage3_param_persistence_threshold": zero.param_persistence_threshold,
              "zero_optimization.stage3_max_live_parameters": zero.max_live_parameters,
              "zero_optimization.stage3_max_reuse_distance": zero.max_reuse_distance,
              "zero_optimization.sub_group_size": zero.sub_group_size,
              "zero_optimization.overlap_comm": zero.overlap_comm}
    assert ds.effective == theirs
    devices = {"offload_optimizer": zero.offload_optimizer, "offload_param": zero.offload_param}
    assert {k: str(getattr(v.device, "value", v.device)) if v else "none" for k, v in devices.items()} == {
        "offload_optimizer": "cpu", "offload_param": "cpu" if "zero3" in path.stem else "none"}


def test_engine_deepspeed_without_deepspeed_says_how_to_install(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert main(["run", "--deepspeed", str(path), "--compare-real", "--engine", "deepspeed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'simpar[deepspeed]'" in err
