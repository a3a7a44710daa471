"""A measured GPU profile: ``simpar calibrate --backend nccl`` fits its micro-benchmarks into the
preset's own form (``costs.gpu.KernelModel``, and NCCL's achieved bus bandwidth), so a simulated
cluster of that GPU is priced with what this machine measured instead of the preset's constants
(``calibrate_gpu``; the micro-benchmarks are gpu_bench.py).

Fits, each in the model's own terms:
- streaming kernels: ``seconds = kernel_overhead + bytes / (hbm_efficiency x datasheet bandwidth)``:
  kernels far larger than L2 set the bandwidth (Theil-Sen), the others the overhead (median);
- GEMMs: with the SM count read from the device and the two constants above, the
  ``gemm_efficiency`` whose shape-dependent times (``costs.gpu.gemm_time``) best match every measured
  GEMM (the median of |log(model / measured)| over the grid 0.300, 0.3025, ... 1.000); FP8 GEMMs,
  where the device has them, the same way against the FP8 peak (``fp8_gemm_efficiency``);
- NCCL: ``seconds = latency + S·2(N-1)/N / busbw`` over all-reduce sizes (Theil-Sen); applied to a
  topology, the NVLink links' achieved fraction becomes busbw over their per-direction rate.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from simpar.calibrate.fits import fit_line
from simpar.costs.gpu import Gemm, KernelModel, gemm_time
from simpar.devices.presets import GPUS
from simpar.devices.specs import GPUSpec
from simpar.errors import SimparError

VERSION = 1
EFFICIENCY_GRID = np.arange(0.300, 1.0001, 0.0025)
# torch.cuda.get_device_name() fragments -> preset (the first that matches; memory decides A100 40/80)
_NAMES = (("H200", "h200"), ("H100", "h100-sxm"), ("V100", "v100-32gb"), ("RTX 3090", "rtx-3090"),
          ("RTX 4090", "rtx-4090"))


def preset_for(device_name: str, memory_bytes: int) -> str | None:
    if "A100" in device_name:
        return "a100-80gb" if memory_bytes > 50 * 2**30 else "a100-40gb"
    if "H100" in device_name and "PCIe" in device_name:
        return None  # no H100 PCIe preset: its clocks and HBM differ from the SXM part
    return next((preset for fragment, preset in _NAMES if fragment in device_name), None)


def fit_stream(rows: list[dict], cache_bytes: int = 0) -> tuple[float, float]:
    """(overhead s, bandwidth bytes/s) of ``overhead + bytes / bandwidth``. The bandwidth comes from
    the kernels that move at least 4x the L2 cache (``cache_bytes``; smaller ones partly stay in L2,
    which Megatron's activations, tens to hundreds of MB, do not), the overhead from those under
    1/32 of it; sizes between are L2's, which the model does not price."""
    large = [r for r in rows if r["bytes"] >= 4 * cache_bytes]
    if len(large) < 2:
        large = rows
    _, per_byte = fit_line([r["bytes"] for r in large], [r["seconds"] for r in large])
    if per_byte <= 0:
        per_byte = float(np.median([r["seconds"] / r["bytes"] for r in large]))
    # the overhead: kernels small enough that even from L2 (the benchmark re-reads its buffers) their
    # bytes take a fraction of a microsecond
    small = [r for r in rows if r not in large and r["bytes"] < cache_bytes / 32] or rows
    overhead = max(0.0, float(np.median([r["seconds"] - r["bytes"] * per_byte for r in small])))
    return overhead, 1.0 / per_byte


def gemm_errors(rows: list[dict], spec: GPUSpec, model: KernelModel, fp8: bool = False) -> np.ndarray:
    """log(model / measured) per measured GEMM (``fp8``: at the FP8 peak, with the model's FP8 efficiency)."""
    peak = spec.peak_flops("fp8" if fp8 else "bf16" if spec.bf16_flops else "fp16")
    model = model.for_fp8() if fp8 else model
    return np.array([math.log(gemm_time(Gemm(r["name"], r["m"], r["n"], r["k"], r["batch"], r["itemsize"], fp8=fp8),
                                        peak, spec.memory_bandwidth, model) / r["seconds"]) for r in rows])


def fit_gemm_efficiency(rows: list[dict], spec: GPUSpec, base: KernelModel, fp8: bool = False) -> float:
    field = "fp8_gemm_efficiency" if fp8 else "gemm_efficiency"
    scores = [float(np.median(np.abs(gemm_errors(rows, spec, dataclasses.replace(base, **{field: e}), fp8))))
              for e in EFFICIENCY_GRID]
    return float(EFFICIENCY_GRID[int(np.argmin(scores))])


def fit_allreduce(rows: list[dict], world: int) -> dict:
    moved = [r["bytes"] * 2 * (world - 1) / world for r in rows]
    latency, per_byte = fit_line(moved, [r["seconds"] for r in rows])
    largest = max(rows, key=lambda r: r["bytes"])
    return {"world": world, "latency_s": latency, "busbw": 1.0 / per_byte if per_byte else math.inf,
            "busbw_largest": largest["bytes"] * 2 * (world - 1) / world / largest["seconds"], "samples": rows}


def fit_profile(machine: dict, preset: str, gemms: list[dict], stream: list[dict], nccl: dict,
                fp8_gemms: list[dict] | None = None, fp8_skipped: str | None = None) -> GPUProfile:
    """``fp8_gemms``: measured FP8 GEMMs (their fit sets ``fp8_gemm_efficiency``); ``fp8_skipped``: why none were."""
    spec = GPUS[preset]
    overhead, bandwidth = fit_stream(stream, machine.get("l2_bytes", 0))
    base = KernelModel(machine["sms"], spec.kernels.gemm_efficiency, min(1.0, bandwidth / spec.memory_bandwidth),
                       overhead, spec.kernels.k_overhead, source=f"simpar calibrate on {machine['name']}")
    fitted = dataclasses.replace(base, gemm_efficiency=fit_gemm_efficiency(gemms, spec, base))
    errors = {name: np.abs(np.expm1(gemm_errors(gemms, spec, model)))
              for name, model in (("fitted", fitted), ("preset", spec.kernels))}
    cache = machine.get("l2_bytes", 0)  # kernels of L2's order of size beat HBM: not what the model prices
    priced = [r for r in stream if not cache / 32 <= r["bytes"] < 4 * cache]
    stream_model = [overhead + r["bytes"] / bandwidth for r in priced]
    fit = {"gemm_median_abs_error": float(np.median(errors["fitted"])),
           "gemm_max_abs_error": float(errors["fitted"].max()),
           "preset_gemm_median_abs_error": float(np.median(errors["preset"])),
           "stream_max_abs_error": max(abs(m / r["seconds"] - 1) for m, r in zip(stream_model, priced)),
           "hbm_bandwidth": bandwidth}
    samples = {"gemms": gemms, "stream": stream}
    if fp8_gemms:
        fitted = dataclasses.replace(fitted, fp8_gemm_efficiency=fit_gemm_efficiency(fp8_gemms, spec, fitted, fp8=True))
        fp8_errors = np.abs(np.expm1(gemm_errors(fp8_gemms, spec, fitted, fp8=True)))
        preset_errors = np.abs(np.expm1(gemm_errors(fp8_gemms, spec, spec.kernels, fp8=True)))
        fit.update(fp8_gemm_median_abs_error=float(np.median(fp8_errors)),
                   fp8_gemm_max_abs_error=float(fp8_errors.max()),
                   preset_fp8_gemm_median_abs_error=float(np.median(preset_errors)))
        samples["fp8_gemms"] = fp8_gemms
    elif fp8_skipped:
        fit["fp8_skipped"] = fp8_skipped
    kernels = {k: v for k, v in asdict(fitted).items() if not (k == "fp8_gemm_efficiency" and v is None)}
    return GPUProfile(machine, preset, kernels, fit, nccl, samples)


@dataclass
class GPUProfile:
    machine: dict  # name, sms, memory_bytes, torch, cuda
    preset: str  # the datasheet (peaks, HBM, capacity) the measured constants refine
    kernels: dict  # KernelModel's fields
    fit: dict  # how well the fitted model matches what was measured
    nccl: dict  # fit_allreduce's result, or {"skipped": why}
    samples: dict = field(default_factory=dict)
    kind: str = "gpu"
    version: int = VERSION

    def save(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(asdict(self), handle, indent=1)

    @classmethod
    def from_dict(cls, data: dict, path: str) -> GPUProfile:
        if data.get("version") != VERSION:
            raise SimparError(f"--hardware: {path} is a version {data.get('version')} GPU profile; "
                              f"recalibrate (simpar calibrate --backend nccl) for version {VERSION}")
        try:
            profile = cls(**data)
            KernelModel(**profile.kernels)
        except TypeError as exc:
            raise SimparError(f"--hardware: {path} is not a simpar GPU profile ({exc})") from None
        if profile.preset not in GPUS:
            raise SimparError(f"--hardware: {path} names GPU preset {profile.preset!r}, which simpar does not know")
        return profile

    def spec(self) -> GPUSpec:
        return dataclasses.replace(GPUS[self.preset], kernels=KernelModel(**self.kernels))

    def apply(self, topology) -> None:
        """Price ``topology``'s GPUs (which must be this profile's kind) with the measured constants,
        and its NVLink links with the measured NCCL bus bandwidth when one was measured."""
        gpu = topology.graph.nodes[topology.gpus[0]]["spec"]
        if gpu.name != self.preset:
            raise SimparError(f"--hardware: the profile measured a {self.preset} ({self.machine['name']}); "
                              f"topology {topology.name} is built of {gpu.name} GPUs: choose a --topology of "
                              f"{self.preset} GPUs")
        spec = self.spec()
        for node in topology.gpus:
            topology.graph.nodes[node]["spec"] = spec
        busbw = self.nccl.get("busbw_largest")
        if busbw and self.nccl.get("world", 1) > 1:
            topology.set_efficiency("nvlink", lambda rate: min(1.0, busbw / rate))


def calibrate_gpu(preset: str | None = None, timeout: float = 600.0, progress=None):
    """Measure this machine's CUDA GPU (and NCCL across its GPUs) and fit a GPUProfile."""
    import torch

    from simpar.costs import gpu_bench
    from simpar.real.cpu_profile import machine_id
    from simpar.real.launch import launch

    say = progress or (lambda message: None)
    if not torch.cuda.is_available():
        raise SimparError("--backend nccl: no CUDA GPU is visible on this machine (torch.cuda.is_available() "
                          "is False); calibrate CPU ranks with --backend gloo")
    props = torch.cuda.get_device_properties(0)
    preset = preset or preset_for(props.name, props.total_memory)
    if preset not in GPUS:
        raise SimparError(f"--gpu: cannot tell which datasheet {props.name!r} is; name one of {', '.join(GPUS)}")
    machine = {**machine_id(), "name": props.name, "sms": props.multi_processor_count,
               "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", 0),
               "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
               "eager_kernel_interval_s": gpu_bench.eager_interval()}
    gemms = gpu_bench.megatron_gemms()
    say(f"{len(gemms)} GEMM shapes of Megatron layers on {props.name}")
    gemm_rows = gpu_bench.gemm_seconds(gemms)
    fp8_rows, fp8_skipped = None, (f"preset {preset} has no FP8 figure" if GPUS[preset].fp8_flops is None
                                   else gpu_bench.fp8_supported())
    if fp8_skipped is None:
        fp8_gemms = gpu_bench.megatron_gemms(fp8=True)
        say(f"{len(fp8_gemms)} FP8 GEMM shapes of fp8-mixed layers")
        fp8_rows = gpu_bench.fp8_gemm_seconds(fp8_gemms)
    say("streaming kernels by size")
    stream_rows = gpu_bench.stream_seconds()
    world = torch.cuda.device_count()
    if world > 1:
        say(f"NCCL all-reduce by size over {world} GPUs")
        ranks = launch(gpu_bench.allreduce_worker, world, (), backend="nccl", timeout=timeout)
        rows = [{"bytes": r["bytes"], "seconds": max(rank[i]["seconds"] for rank in ranks)}
                for i, r in enumerate(ranks[0])]
        nccl = fit_allreduce(rows, world)
    else:
        nccl = {"skipped": f"one GPU visible ({props.name}): NCCL collectives need two or more"}
    return fit_profile(machine, preset, gemm_rows, stream_rows, nccl, fp8_rows, fp8_skipped)
