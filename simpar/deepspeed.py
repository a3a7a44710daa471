"""A DeepSpeed config (``ds_config.json``) read into simpar's strategy and training flags.

What is read and how:
- ``zero_optimization.stage`` 0/1/2/3 -> ddp / zero1 / zero2 / zero3; ``offload_optimizer.device`` cpu
  -> zero2-offload or zero3-offload, nvme (optimizer or parameters) -> zero3-infinity;
  ``offload_param.device`` cpu needs stage 3 (as in DeepSpeed).
- ``train_batch_size`` = ``train_micro_batch_size_per_gpu`` x ``gradient_accumulation_steps`` x dp:
  any one of them may be missing or "auto" and is solved from the others (with the command line's
  --micro-batch / --global-batch standing in for an "auto"), as DeepSpeed and the HF Trainer do.
- ``fp16.enabled`` / ``bf16.enabled`` -> precision ("auto": the --precision flag).
- ``reduce_bucket_size`` (elements) -> gradient bucket bytes; "auto" is hidden^2, as in the HF Trainer.
- ``stage3_prefetch_bucket_size`` (elements) -> layers gathered ahead; "auto" is 0.9 hidden^2.
- ``overlap_comm`` -> false: communication does not overlap compute.
- ``optimizer.type`` -> adam / adamw / sgd.
Everything else is reported: DeepSpeed keys simpar has no model for, and keys DeepSpeed does not have.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from simpar.errors import SimparError
from simpar.models.spec import ModelSpec
from simpar.scenario import GRAD_DTYPES

# DeepSpeed keys that do not change step time or memory in simpar's model (or are not modelled);
# they are listed back to the user, never dropped silently.
NOT_MODELLED = {
    "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "scheduler", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "dump_state", "communication_data_type",
    "seq_parallel_communication_data_type",
    "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "amp", "checkpoint",
    "elasticity", "aio", "memory_breakdown", "autotuning", "compression_training", "data_efficiency",
    "pipeline", "moe", "curriculum_learning", "train_batch_size_per_gpu", "load_universal_checkpoint",
}
ZERO_NOT_MODELLED = {
    "contiguous_gradients", "reduce_scatter", "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "elastic_checkpoint", "ignore_unused_parameters",
    "use_multi_rank_bucket_allreduce", "zero_quantized_nontrainable_weights", "memory_efficient_linear",
    "load_from_fp32_weights", "allgather_partitions", "allgather_bucket_size", "mics_shard_size", "legacy_stage1",
    "stage3_model_persistence_threshold", "stage3_module_granularity_threshold", "compute_grad_norm",
    "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "cpu_offload_use_pin_memory",
    "parameter_alignment", "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
    "enable_sanity_checks", "zenflow", "leaf_module", "mics_hierarchical_params_gather",
}
# DeepSpeed reads its ZeRO-3 fields by name or by their "stage3_" alias (pydantic, populate_by_name);
# simpar keys them by the alias, the name its docs and templates use
ZERO_ALIASES = {name: f"stage3_{name}" for name in (
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold", "max_live_parameters",
    "max_reuse_distance", "gather_16bit_weights_on_model_save", "module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "allgather_sequential")}
# DeepSpeed's defaults (deepspeed/runtime/zero/config.py, 0.19) for what a config leaves out
ZERO_DEFAULTS = {"reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000,
                 "stage3_param_persistence_threshold": 100_000, "stage3_max_live_parameters": 1_000_000_000,
                 "stage3_max_reuse_distance": 1_000_000_000, "sub_group_size": 1_000_000_000}
REASONS = {"allgather_bucket_size": "simpar gathers updated parameters in the reduce buckets",
           "moe": "DeepSpeed configures MoE in the model's code (deepspeed.moe.layer.MoE); give --experts, --top-k, "
                  "--capacity-factor and --ep"}
TOP_LEVEL = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "zero_optimization", "fp16", "bf16", "bfloat16", "optimizer", "data_types"}
ZERO_READ = {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size", "overlap_comm",
             "stage3_prefetch_bucket_size", "stage3_max_reuse_distance", "stage3_param_persistence_threshold",
             "stage3_max_live_parameters", "sub_group_size", "zero_quantized_weights", "zero_hpz_partition_size",
             "zero_quantized_gradients"}
OPTIMIZER_TYPES = {"adam": "adam", "adamw": "adamw", "fusedadam": "adam", "cpuadam": "adam",
                   "deepspeedcpuadam": "adam", "sgd": "sgd"}


@dataclass
class DeepSpeedSettings:
    """What a config resolves to: make_scenario arguments, and what to tell the user."""

    strategy: str
    micro_batch: int
    global_batch: int
    microbatches: int
    precision: str
    optimizer: str | None
    options: dict  # StrategySpec fields: bucket_bytes, prefetch, overlap_comm
    effective: dict[str, object] = field(default_factory=dict)  # DeepSpeed's name -> the value it runs with
    resolved: dict[str, object] = field(default_factory=dict)  # "auto" or missing key -> the value it took
    defaults: dict[str, object] = field(default_factory=dict)  # ZeRO keys left out -> DeepSpeed's default
    ignored: list[str] = field(default_factory=list)  # DeepSpeed keys read but not modelled
    unknown: list[str] = field(default_factory=list)  # keys DeepSpeed does not have

    def report(self) -> list[str]:
        lines = [f"deepspeed: strategy {self.strategy}, micro-batch {self.micro_batch} x accumulation "
                 f"{self.microbatches} (global batch {self.global_batch}), {self.precision}"]
        if self.resolved:
            values = ", ".join(f"{k}={v}" for k, v in self.resolved.items())
            lines.append(f"deepspeed: resolved (\"auto\" or not given): {values}")
        if self.defaults:
            values = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
            lines.append(f"deepspeed: DeepSpeed's defaults (not in the config): {values}")
        if self.ignored:
            lines.append("deepspeed: not modelled (no effect on this simulation): " + ", ".join(self.ignored))
        if self.unknown:
            lines.append("deepspeed: unknown keys (not DeepSpeed settings; typo?): " + ", ".join(self.unknown))
        return lines


def _value(config: dict, key: str, where: str, kind=int, auto=None):
    """config[key] as ``kind``; "auto" or missing -> ``auto``."""
    value = config.get(key)
    if value is None or value == "auto":
        return auto
    if kind is bool:
        if not isinstance(value, bool):
            raise SimparError(f"--deepspeed: {where}{key} must be true, false or \"auto\", got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise SimparError(f"--deepspeed: {where}{key} must be a whole number or \"auto\", got {value!r}")
    return int(value)


def _device(section: object, name: str) -> str:
    if section is None:
        return "none"
    if not isinstance(section, dict):
        raise SimparError(f"--deepspeed: zero_optimization.{name} must be an object")
    device = str(section.get("device", "none")).lower()
    if device not in ("none", "cpu", "nvme"):
        raise SimparError(f"--deepspeed: zero_optimization.{name}.device must be none, cpu or nvme, got {device!r}")
    return device


def _strategy(stage: int, optimizer_device: str, param_device: str) -> str:
    if stage not in (0, 1, 2, 3):
        raise SimparError(f"--deepspeed: zero_optimization.stage must be 0, 1, 2 or 3, got {stage}")
    if "nvme" in (optimizer_device, param_device):
        if stage != 3:
            raise SimparError("--deepspeed: NVMe offload (ZeRO-Infinity) needs zero_optimization.stage 3")
        return "zero3-infinity"
    if param_device == "cpu" and stage != 3:
        raise SimparError("--deepspeed: offload_param needs zero_optimization.stage 3")
    if param_device == "cpu" and optimizer_device != "cpu":
        raise SimparError("--deepspeed: simpar models offload_param together with offload_optimizer (as "
                          "DeepSpeed's estimators do); add offload_optimizer.device cpu")
    if optimizer_device == "cpu" or param_device == "cpu":
        if stage < 2:
            raise SimparError("--deepspeed: simpar models optimizer offload with stage 2 or 3 "
                              f"(ZeRO-Offload), not stage {stage}")
        return f"zero{stage}-offload"
    return {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]


def _batch(config: dict, dp: int, micro_flag: int | None, global_flag: int | None, resolved: dict):
    """(micro-batch, accumulation, global batch) with train = micro x accumulation x dp."""
    micro = _value(config, "train_micro_batch_size_per_gpu", "")
    accumulation = _value(config, "gradient_accumulation_steps", "")
    total = _value(config, "train_batch_size", "")
    for key, value in (("train_micro_batch_size_per_gpu", micro), ("gradient_accumulation_steps", accumulation),
                       ("train_batch_size", total)):
        if value == 0:
            raise SimparError(f"--deepspeed: {key} must be at least 1")
    if micro is None and micro_flag is not None:
        micro = resolved["train_micro_batch_size_per_gpu"] = micro_flag
    if total is None and global_flag is not None:
        total = resolved["train_batch_size"] = global_flag
    if micro is None and accumulation is not None and total is not None:
        micro = resolved["train_micro_batch_size_per_gpu"] = total // (accumulation * dp)
    if micro is None:
        micro = resolved["train_micro_batch_size_per_gpu"] = 1
    if accumulation is None:
        accumulation = max(1, total // (micro * dp)) if total is not None else 1
        resolved["gradient_accumulation_steps"] = accumulation
    if total is None:
        total = resolved["train_batch_size"] = micro * accumulation * dp
    if total != micro * accumulation * dp:
        raise SimparError(f"--deepspeed: train_batch_size {total} != train_micro_batch_size_per_gpu {micro} x "
                          f"gradient_accumulation_steps {accumulation} x data-parallel ranks {dp} = "
                          f"{micro * accumulation * dp}")
    return micro, accumulation, total


def _zero_section(config: dict, resolved: dict) -> dict:
    """zero_optimization with DeepSpeed's aliases and deprecated keys read as DeepSpeed reads them."""
    zero = config.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise SimparError("--deepspeed: zero_optimization must be an object")
    out: dict = {}
    for key, value in zero.items():
        name = ZERO_ALIASES.get(key, key)
        if name in out:
            raise SimparError(f"--deepspeed: zero_optimization gives {name} twice (also as {key})")
        out[name] = value
    # deprecated booleans (DeepSpeed maps them to the offload sections)
    for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if old in out:
            flag = out.pop(old)
            if flag is True and out.get(new) is None:
                out[new] = {"device": "cpu"}
                resolved[f"zero_optimization.{new}.device"] = f"cpu (from the deprecated {old})"
    return out


def _precision(config: dict, flag: str | None, resolved: dict) -> str:
    """fp16 / bf16 enabled -> mixed precision; neither -> fp32, as in DeepSpeed; "auto" -> --precision.
    ``bfloat16`` is DeepSpeed's old name for ``bf16``, read where ``bf16`` is absent (precision_config.py)."""
    enabled = {}
    for key in ("fp16", "bf16"):
        section = config.get(key)
        if section is None and key == "bf16":
            section = config.get("bfloat16")
        section = section or {}
        if not isinstance(section, dict):
            raise SimparError(f"--deepspeed: {key} must be an object")
        enabled[key] = _value(section, "enabled", f"{key}.", kind=bool, auto=None)
        if section.get("enabled") == "auto":
            enabled[key] = resolved[f"{key}.enabled"] = (flag or "bf16-mixed") == f"{key}-mixed"
    if enabled["fp16"] and enabled["bf16"]:
        raise SimparError("--deepspeed: fp16.enabled and bf16.enabled are both true; choose one")
    precision = "fp16-mixed" if enabled["fp16"] else "bf16-mixed" if enabled["bf16"] else "fp32"
    if flag is not None and flag != precision:
        raise SimparError(f"--precision: the DeepSpeed config trains in {precision}, not {flag}; "
                          "leave --precision out or change fp16/bf16 in the config")
    return precision


def read_config(config: dict, model: ModelSpec, dp: int, precision_flag: str | None = None,
                micro_flag: int | None = None, global_flag: int | None = None) -> DeepSpeedSettings:
    """Resolve a parsed DeepSpeed config for ``model`` on ``dp`` data-parallel ranks."""
    if not isinstance(config, dict):
        raise SimparError("--deepspeed: the config must be a JSON object")
    resolved: dict[str, object] = {}
    zero = _zero_section(config, resolved)
    stage = _value(zero, "stage", "zero_optimization.", auto=0)
    param_device = _device(zero.get("offload_param"), "offload_param")
    strategy = _strategy(stage, _device(zero.get("offload_optimizer"), "offload_optimizer"), param_device)
    micro, accumulation, total = _batch(config, dp, micro_flag, global_flag, resolved)

    precision = _precision(config, precision_flag, resolved)
    grad_bytes = 4 if precision == "fp32" else 2

    effective = {"train_batch_size": total, "train_micro_batch_size_per_gpu": micro,
                 "gradient_accumulation_steps": accumulation, "zero_optimization.stage": stage,
                 "fp16.enabled": precision == "fp16-mixed", "bf16.enabled": precision == "bf16-mixed"}
    defaults: dict[str, object] = {}
    sizes = {key: _zero_size(zero, key, model, resolved, defaults) for key in ZERO_DEFAULTS}
    effective.update({f"zero_optimization.{key}": value for key, value in sizes.items()})
    options: dict[str, object] = {"bucket_bytes": max(1, sizes["reduce_bucket_size"]) * grad_bytes}
    if stage > 0:  # the ZeRO optimizers' fp32 partitions and all-reduced gradient buckets (Scenario's comments)
        options["deepspeed_habits"] = True
    if param_device == "cpu":
        options["offload_params"] = True
    if stage == 3:  # layers whose parameters fit in the prefetch bucket; modules reused within the distance stay
        options["prefetch"] = min(model.layers, math.floor(sizes["stage3_prefetch_bucket_size"] / model.layer_params()))
        options["max_reuse_distance"] = sizes["stage3_max_reuse_distance"]
        options["param_persistence_threshold"] = sizes["stage3_param_persistence_threshold"]
        options["max_live_parameters"] = sizes["stage3_max_live_parameters"]
        options["sub_group_size"] = sizes["sub_group_size"]
        # ZeRO++: int8 weight gathers, the hpZ partition, int4 gradient reduce-scatters (simpar: layer by layer)
        for key, option in (("zero_quantized_weights", "zeropp_qwz"), ("zero_quantized_gradients", "zeropp_qgz")):
            if _value(zero, key, "zero_optimization.", kind=bool, auto=False):
                options[option] = effective[f"zero_optimization.{key}"] = True
        hpz = _value(zero, "zero_hpz_partition_size", "zero_optimization.", auto=1)
        if hpz > 1:
            options["zeropp_hpz"] = effective["zero_optimization.zero_hpz_partition_size"] = hpz
    overlap = _value(zero, "overlap_comm", "zero_optimization.", kind=bool, auto=None)
    if overlap is None:  # DeepSpeed's default: overlap for stage 3 only (zero/config.py, overlap_comm_valid)
        overlap = defaults["overlap_comm"] = stage == 3
    options["overlap_comm"] = effective["zero_optimization.overlap_comm"] = overlap
    types = config.get("data_types", {})
    if not isinstance(types, dict):
        raise SimparError("--deepspeed: data_types must be an object")
    accum = types.get("grad_accum_dtype")
    if accum is not None:  # DeepSpeed's names: fp32, fp16, bf16
        if str(accum).lower() not in GRAD_DTYPES:
            raise SimparError(f"--deepspeed: data_types.grad_accum_dtype {accum!r}: must be fp32, fp16 or bf16")
        options["grad_accum_dtype"] = str(accum).lower()

    optimizer = None
    section = config.get("optimizer")
    if isinstance(section, dict) and section.get("type") is not None:
        kind = str(section["type"]).replace("_", "").lower()
        if kind not in OPTIMIZER_TYPES:
            raise SimparError(f"--deepspeed: optimizer.type {section['type']!r}: simpar models "
                              "Adam, AdamW and SGD")
        optimizer = OPTIMIZER_TYPES[kind]
        if optimizer == "sgd" and (section.get("params") or {}).get("momentum"):
            optimizer = "sgd-momentum"

    ignored = sorted(k + (f" ({REASONS[k]})" if k in REASONS else "") for k in config if k in NOT_MODELLED)
    ignored += sorted(f"zero_optimization.{k}" + (f" ({REASONS[k]})" if k in REASONS else "")
                      for k in zero if k in ZERO_NOT_MODELLED)
    unknown = sorted(k for k in config if k not in TOP_LEVEL | NOT_MODELLED)
    unknown += sorted(f"zero_optimization.{k}" for k in zero if k not in ZERO_READ | ZERO_NOT_MODELLED)
    relevant = ("reduce_bucket_size", "overlap_comm") if stage < 3 else tuple(defaults)  # the rest: stage 3 only
    defaults = {k: v for k, v in defaults.items() if k in relevant and (stage > 0 or k == "overlap_comm")}
    return DeepSpeedSettings(strategy, micro, total, accumulation, precision, optimizer, options, effective,
                             resolved, defaults, ignored, unknown)


# What the HF Trainer puts for "auto" once it knows the model (transformers' HfTrainerDeepSpeedConfig.
# trainer_config_finalize); other "auto" values in zero_optimization are left to DeepSpeed, which refuses them
HF_AUTO = {"reduce_bucket_size": lambda h: h * h, "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
           "stage3_param_persistence_threshold": lambda h: 10 * h}


def _zero_size(zero: dict, key: str, model: ModelSpec, resolved: dict, defaults: dict) -> int:
    """A ZeRO size in elements: the config's, the HF Trainer's "auto", or DeepSpeed's default."""
    if zero.get(key) == "auto":
        if key not in HF_AUTO:
            raise SimparError(f"--deepspeed: zero_optimization.{key} is \"auto\", which neither the HF Trainer "
                              "nor DeepSpeed fills; give a number")
        value = resolved[key] = HF_AUTO[key](model.hidden)
        return value
    value = _value(zero, key, "zero_optimization.", auto=None)
    if value is None:
        value = defaults[key] = ZERO_DEFAULTS[key]
    return value


def load(path: str) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except OSError as exc:
        raise SimparError(f"--deepspeed: cannot read {path!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SimparError(f"--deepspeed: {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None


def filled(config: dict, settings: DeepSpeedSettings) -> dict:
    """The config with every "auto" replaced by what simpar resolved it to (as the HF Trainer hands
    DeepSpeed a config): what a real DeepSpeed run of the same settings is given."""
    out = json.loads(json.dumps(config))
    values = {**settings.effective, **{f"zero_optimization.{k}": v for k, v in settings.resolved.items()
                                       if k in HF_AUTO}}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        out[key] = values[key]
    for key in ("fp16", "bf16"):
        section = out.get(key) if key in out or key == "fp16" else out.get("bfloat16")
        if isinstance(section, dict) and section.get("enabled") == "auto":
            section["enabled"] = values[f"{key}.enabled"]
    zero = out.get("zero_optimization")
    if isinstance(zero, dict):
        for key, value in list(zero.items()):
            if value == "auto":
                zero[key] = values[f"zero_optimization.{ZERO_ALIASES.get(key, key)}"]
    return out
