"""Prices a Plan's Compute ops on a GPU, kernel by kernel (the simulator's one question here)."""

from __future__ import annotations

from simpar.costs.gpu import MemoryBound, kernel_time
from simpar.costs.kernels import Shape, unit_kernels
from simpar.scenario import Scenario


class KernelPricer:
    def __init__(self, scenario: Scenario, gpu):
        self.shape = Shape.of(scenario)
        self.peak, self.hbm, self.model = gpu.peak_flops(scenario.train.compute_dtype), gpu.memory_bandwidth, gpu.kernels
        self.fp8_peak = gpu.peak_flops("fp8") if self.shape.fp8 else None
        self.fp8_model = self.model.for_fp8()  # a GPU profile's measured FP8 efficiency, where it has one
        self._cache: dict = {}  # (unit kind, phase, part) -> seconds: every micro-batch costs the same

    def kernel_seconds(self, kernel) -> float:
        """One kernel's time (FP8 GEMMs at the FP8 peak)."""
        if getattr(kernel, "fp8", False):
            return kernel_time(kernel, self.fp8_peak, self.hbm, self.fp8_model)
        return kernel_time(kernel, self.peak, self.hbm, self.model)

    def time(self, kind: str, op) -> float:
        if op.phase == "step":  # the optimizer: memory-bound over every state it reads and writes
            return kernel_time(MemoryBound("optimizer step", op.bytes), self.peak, self.hbm, self.model)
        key = (kind, op.phase, op.part)
        if key not in self._cache:
            self._cache[key] = sum(self.kernel_seconds(k) for k in unit_kernels(self.shape, kind, op.phase, op.part))
        return self._cache[key]
