"""Prices a Plan's Compute ops on a GPU, kernel by kernel (the simulator's one question here)."""

from __future__ import annotations

from simpar.costs.gpu import MemoryBound, kernel_time
from simpar.costs.kernels import Shape, unit_kernels
from simpar.scenario import Scenario


def shape_of(scenario: Scenario) -> Shape:
    spec, train = scenario.strategy, scenario.train
    return Shape(scenario.model, train.micro_batch, spec.tp, spec.sequence_parallel, spec.recompute,
                 spec.flash_attention, train.weight_bytes)


class KernelPricer:
    def __init__(self, scenario: Scenario, gpu, dtype: str):
        self.shape = shape_of(scenario)
        self.peak, self.hbm, self.model = gpu.peak_flops(dtype), gpu.memory_bandwidth, gpu.kernels
        self._cache: dict = {}

    def kernels(self, kind: str, phase: str, part: str = ""):
        return unit_kernels(self.shape, kind, phase, part)

    def time(self, kind: str, op) -> float:
        if op.phase == "step":  # the optimizer: memory-bound over every state it reads and writes
            return kernel_time(MemoryBound("optimizer step", op.bytes), self.peak, self.hbm, self.model)
        key = (kind, op.phase, op.part)
        if key not in self._cache:
            self._cache[key] = sum(kernel_time(k, self.peak, self.hbm, self.model)
                                   for k in self.kernels(kind, op.phase, op.part))
        return self._cache[key]
