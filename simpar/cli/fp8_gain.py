"""``simpar run --precision fp8-mixed``: the same step in bf16-mixed beside it, and where the difference comes
from (the FP8 GEMMs' time, the activations they keep in FP8, the FP8 weight copies)."""

from __future__ import annotations

from dataclasses import replace

from simpar import units
from simpar.costs.kernels import Shape, unit_kernels
from simpar.costs.pricing import KernelPricer
from simpar.scenario import Scenario


def gemm_seconds(scenario: Scenario, gpu) -> tuple[float, float]:
    """(seconds of a layer's linear GEMMs, of all its kernels) for one micro-batch, forward and backward."""
    pricer, shape = KernelPricer(scenario, gpu), Shape.of(scenario)
    linear = total = 0.0
    for phase in ("fwd", "bwd"):
        for kernel in unit_kernels(shape, "layer", phase):
            seconds = pricer.kernel_seconds(kernel)
            total += seconds
            if kernel.name.startswith(("qkv", "attention output", "mlp up", "mlp down")):
                linear += seconds
    return linear, total


def as_bf16(scenario: Scenario) -> Scenario:
    return replace(scenario, train=replace(scenario.train, precision="bf16-mixed"))


def print_fp8_gain(scenario: Scenario, result, base, gpu) -> None:
    """``base``: the step simulated in bf16-mixed (``as_bf16``) on the same GPUs, ``gpu``."""
    bf16 = as_bf16(scenario)
    (fp8_linear, fp8_layer), (bf16_linear, bf16_layer) = gemm_seconds(scenario, gpu), gemm_seconds(bf16, gpu)
    mem, was = result.ranks[0]["memory"], base.ranks[0]["memory"]
    print(f"\nvs bf16-mixed: step {units.human_time(base.step_time_s)} -> {units.human_time(result.step_time_s)} "
          f"({base.step_time_s / result.step_time_s:.2f}x faster)")
    print(f"  compute: a layer's linear GEMMs (forward and backward, one micro-batch) {units.human_time(bf16_linear)} "
          f"-> {units.human_time(fp8_linear)} at the FP8 peak ({gpu.fp8_flops / gpu.bf16_flops:.1f}x bf16's), "
          f"the whole "
          f"layer {units.human_time(bf16_layer)} -> {units.human_time(fp8_layer)} (attention, norms, the head and "
          f"communication stay as they were)")
    print(f"  memory (rank 0): activations {units.human_bytes(was['activations'])} -> "
          f"{units.human_bytes(mem['activations'])} (the linear GEMMs' inputs kept in FP8), plus "
          f"{units.human_bytes(mem['buffers'] - was['buffers'])} of FP8 weights and their transposes; peak "
          f"{units.human_bytes(was['peak'])} -> {units.human_bytes(mem['peak'])}")
