"""simpar calibrate --backend nccl: the GPU micro-benchmarks (run here on the CPU, as far as they go),
the fits into the kernel model's form, and the profile that prices a simulated cluster's GPUs."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from simpar.costs import gpu_bench
from simpar.costs.gpu_profile import (GPUProfile, fit_allreduce, fit_gemm_efficiency, fit_profile, fit_stream,
                                          preset_for)
from simpar.calibrate.profile import HardwareProfile
from simpar.costs.gpu import Gemm, KernelModel, gemm_time
from simpar.devices.presets import GPUS
from simpar.errors import SimparError
from simpar.topologies import build

H100_PROFILE = Path(__file__).parent.parent / "validation" / "profiles" / "h100-sxm-80gb-hbm3.json"


def test_megatron_gemms_are_the_shapes_the_model_prices():
    gemms = gpu_bench.megatron_gemms(hidden_heads=((1024, 8),), micro_batches=(2,), tp_degrees=(1, 2))
    shapes = {(g.name, g.m, g.n, g.k, g.batch) for g in gemms}
    tokens = 2 * 2048
    assert ("qkv", tokens, 3 * 1024, 1024, 1) in shapes  # TP 1: all heads
    assert ("qkv", tokens, 3 * 1024 // 2, 1024, 1) in shapes  # TP 2: half the heads
    assert ("attention scores", 2048, 2048, 128, 2 * 8 // 2) in shapes  # batch x heads / t
    assert len(shapes) == len(gemms)  # each shape measured once


def test_benchmarks_run_on_the_cpu():
    rows = gpu_bench.gemm_seconds([Gemm("g", 32, 16, 64), Gemm("b", 16, 16, 32, batch=3, itemsize=4)],
                                  device="cpu", budget_s=1e-4)
    assert [(r["m"], r["batch"]) for r in rows] == [(32, 1), (16, 3)] and all(r["seconds"] > 0 for r in rows)
    stream = gpu_bench.stream_seconds((256, 4096), device="cpu")
    assert [r["bytes"] for r in stream] == [3 * 256 * 2, 3 * 4096 * 2] and all(r["seconds"] > 0 for r in stream)


def test_allreduce_worker_runs_on_gloo():
    from simpar.real.launch import launch

    ranks = launch(gpu_bench.allreduce_worker, 2, ((2**12, 2**16), 2), timeout=120)
    assert [r["bytes"] for r in ranks[0]] == [2**12, 2**16] and all(r["seconds"] > 0 for r in ranks[1])


def test_stream_fit_recovers_overhead_and_bandwidth_and_ignores_l2_sizes():
    overhead, bandwidth, cache = 2e-6, 2.5e12, 40 * 2**20
    sizes = [2**k for k in range(12, 32)]
    rows = [{"bytes": b, "seconds": overhead + b / bandwidth} for b in sizes]
    for r in rows:
        if cache / 32 <= r["bytes"] < 4 * cache:  # served from L2: far faster than HBM
            r["seconds"] = overhead + r["bytes"] / (3 * bandwidth)
    fitted_overhead, fitted_bandwidth = fit_stream(rows, cache)
    assert fitted_overhead == pytest.approx(overhead, rel=1e-6)
    assert fitted_bandwidth == pytest.approx(bandwidth, rel=1e-6)


def test_gemm_fit_recovers_the_efficiency_that_made_the_times():
    spec = GPUS["a100-80gb"]
    truth = dataclasses.replace(spec.kernels, gemm_efficiency=0.62)
    gemms = gpu_bench.megatron_gemms(hidden_heads=((2048, 16), (4096, 32)), micro_batches=(1,), tp_degrees=(1, 4))
    rows = [{"name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "itemsize": g.itemsize,
             "seconds": gemm_time(g, spec.peak_flops("bf16"), spec.memory_bandwidth, truth)} for g in gemms]
    assert fit_gemm_efficiency(rows, spec, spec.kernels) == pytest.approx(0.62, abs=1e-9)


def test_fp8_gemms_are_the_layers_linear_gemms_and_run_on_the_cpu():
    gemms = gpu_bench.megatron_gemms(hidden_heads=((1024, 8),), micro_batches=(1,), tp_degrees=(1,), fp8=True)
    assert gemms and all(g.fp8 and g.itemsize == 1 and g.batch == 1 for g in gemms)
    assert {g.name.split(" dgrad")[0].split(" wgrad")[0] for g in gemms} == {"qkv", "attention output", "mlp up",
                                                                             "mlp down"}
    rows = gpu_bench.fp8_gemm_seconds([Gemm("qkv", 32, 48, 64, itemsize=1, fp8=True),
                                       Gemm("odd", 30, 48, 64, itemsize=1, fp8=True)], device="cpu", budget_s=1e-4)
    assert [(r["name"], r["itemsize"]) for r in rows] == [("qkv", 1)] and rows[0]["seconds"] > 0  # (16s only)
    assert gpu_bench.fp8_supported("cpu") is None


def _fp8_rows(spec, base, efficiency):
    truth = dataclasses.replace(base, fp8_gemm_efficiency=efficiency).for_fp8()
    gemms = gpu_bench.megatron_gemms(hidden_heads=((2048, 16), (4096, 32)), micro_batches=(1,), tp_degrees=(1, 4),
                                     fp8=True)
    return [{"name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": 1, "itemsize": 1,
             "seconds": gemm_time(g, spec.peak_flops("fp8"), spec.memory_bandwidth, truth)} for g in gemms]


def test_measured_fp8_gemms_set_the_profiles_fp8_efficiency_and_price_fp8_runs():
    """A profile with FP8 samples prices fp8-mixed's linear GEMMs at the fitted fraction of the FP8 peak, its
    bf16 GEMMs as before; a profile without them (the committed H100 one) prices FP8 at its bf16 efficiency."""
    from simpar.costs.kernels import Shape, unit_kernels
    from simpar.costs.pricing import KernelPricer
    from simpar.models import model
    from simpar.scenario import make_scenario

    data = json.loads(H100_PROFILE.read_text())
    spec = GPUS["h100-sxm"]
    profile = fit_profile(data["machine"], data["preset"], data["samples"]["gemms"], data["samples"]["stream"],
                          data["nccl"], _fp8_rows(spec, KernelModel(**data["kernels"]), 0.47))
    assert profile.kernels["fp8_gemm_efficiency"] == pytest.approx(0.47, abs=1e-9)
    assert profile.fit["fp8_gemm_median_abs_error"] == pytest.approx(0.0, abs=1e-9)
    assert {k: v for k, v in profile.kernels.items() if k != "fp8_gemm_efficiency"} == data["kernels"]
    loaded = GPUProfile.from_dict(json.loads(json.dumps(dataclasses.asdict(profile))), "test")
    scenario = make_scenario(model("gpt2-medium"), "3d", 8, tp=2, dp=4, sequence_parallel=True,
                             precision="fp8-mixed", topology="dgx-h100")
    committed = HardwareProfile.load(str(H100_PROFILE))
    for source, fp8_efficiency in ((loaded, profile.kernels["fp8_gemm_efficiency"]),
                                   (committed, data["kernels"]["gemm_efficiency"])):
        gpu = source.spec()
        pricer = KernelPricer(scenario, gpu)
        for kernel in unit_kernels(Shape.of(scenario), "layer", "fwd"):
            if isinstance(kernel, Gemm):
                fp8 = kernel.fp8
                expected = gemm_time(kernel, gpu.peak_flops("fp8" if fp8 else "bf16"), gpu.memory_bandwidth,
                                     dataclasses.replace(gpu.kernels, gemm_efficiency=fp8_efficiency if fp8
                                                         else data["kernels"]["gemm_efficiency"]))
                assert pricer.kernel_seconds(kernel) == pytest.approx(expected, rel=1e-12)
    skipped = fit_profile(data["machine"], "a100-80gb", data["samples"]["gemms"], data["samples"]["stream"],
                          data["nccl"], fp8_skipped="preset a100-80gb has no FP8 figure")
    assert skipped.fit["fp8_skipped"].startswith("preset a100-80gb") and "fp8_gemms" not in skipped.samples


def test_allreduce_fit_recovers_bus_bandwidth_and_latency():
    world, busbw, latency = 8, 230e9, 30e-6
    rows = [{"bytes": s, "seconds": latency + s * 2 * (world - 1) / world / busbw} for s in (2**20, 2**24, 2**28)]
    fit = fit_allreduce(rows, world)
    assert fit["busbw"] == pytest.approx(busbw) and fit["latency_s"] == pytest.approx(latency)


def test_preset_from_the_device_name():
    assert preset_for("NVIDIA H100 80GB HBM3", 80 * 2**30) == "h100-sxm"
    assert preset_for("NVIDIA A100-SXM4-40GB", 40 * 2**30) == "a100-40gb"
    assert preset_for("NVIDIA A100-SXM4-80GB", 80 * 2**30) == "a100-80gb"
    assert preset_for("NVIDIA H100 PCIe", 80 * 2**30) is None
    assert preset_for("Tesla T4", 16 * 2**30) is None


def test_the_measured_h100_profile_is_the_fit_of_its_own_samples():
    """The profile in the repository (measured with simpar calibrate --backend nccl on an H100 SXM)
    is what the fit makes of the samples stored in it."""
    data = json.loads(H100_PROFILE.read_text())
    refit = fit_profile(data["machine"], data["preset"], data["samples"]["gemms"], data["samples"]["stream"],
                        data["nccl"])
    assert refit.kernels == data["kernels"] and refit.fit == data["fit"]
    assert data["machine"]["sms"] == GPUS["h100-sxm"].kernels.sms  # the device agrees with the whitepaper


def test_gpu_profile_prices_the_topologys_gpus(tmp_path):
    profile = HardwareProfile.load(str(H100_PROFILE))
    assert isinstance(profile, GPUProfile)
    topology = build("dgx-h100", 16)
    profile.apply(topology)
    spec = topology.graph.nodes[topology.gpus[-1]]["spec"]
    assert spec.kernels == KernelModel(**profile.kernels) and spec.memory_bandwidth == GPUS["h100-sxm"].memory_bandwidth
    with pytest.raises(SimparError, match="--topology of h100-sxm"):
        profile.apply(build("dgx-a100", 8))


def test_measured_nccl_bandwidth_sets_the_nvlink_efficiency():
    data = json.loads(H100_PROFILE.read_text())
    data["nccl"] = {"world": 8, "busbw": 350e9, "busbw_largest": 360e9, "latency_s": 2e-5}
    profile = GPUProfile.from_dict(data, "test")
    topology = build("dgx-h100", 8)
    nvlink = [c for c in range(topology.num_channels) if topology.channel_kind(c) == "nvlink"]
    before = topology.capacities[nvlink]
    profile.apply(topology)
    after = topology.capacities[nvlink]
    assert after == pytest.approx([360e9] * len(nvlink))  # busbw over each GPU's 450 GB/s, times it
    assert not math.isclose(before[0], after[0])


def test_cli_run_with_a_gpu_profile(cli):
    done = cli("run", "--strategy", "3d", "--model", "gpt2", "--gpus", "8", "--tp", "2", "--topology", "dgx-h100",
               "--hardware", str(H100_PROFILE), "--json", "-")
    preset = cli("run", "--strategy", "3d", "--model", "gpt2", "--gpus", "8", "--tp", "2", "--topology", "dgx-h100",
                 "--json", "-")
    assert done.returncode == 0 and preset.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sim"]["step_time_s"] != json.loads(preset.stdout)["sim"]["step_time_s"]
    wrong = cli("run", "--gpus", "8", "--hardware", str(H100_PROFILE))  # default topology: A100s
    assert wrong.returncode != 0 and "--hardware" in wrong.stderr and "Traceback" not in wrong.stderr


def test_cli_calibrate_nccl_without_a_gpu_says_so(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    done = cli("calibrate", "--backend", "nccl")
    assert done.returncode != 0 and "no CUDA GPU" in done.stderr and "Traceback" not in done.stderr
    bad = cli("calibrate", "--backend", "mpi")
    assert bad.returncode != 0 and "--backend" in bad.stderr
    bad_gpu = cli("calibrate", "--backend", "nccl", "--gpu", "tpu-v9")
    assert bad_gpu.returncode != 0 and "--gpu" in bad_gpu.stderr
