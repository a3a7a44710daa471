"""What one kernel costs on a GPU.

A GEMM of ``batch`` x (M x K) @ (K x N) is split by the library into output tiles, each tile a
thread block on one SM; the SMs run the tiles in *waves*. Its time is the larger of

- compute: 2·batch·M·N·K FLOPs at the dtype's peak x ``gemm_efficiency`` (what large, square,
  well-aligned GEMMs reach), lowered by tile quantization (padding M and N up to whole tiles),
  wave quantization (the last wave leaves SMs idle), the tile's own efficiency (small tiles
  re-read more operand bytes per FLOP) and a short-K penalty K / (K + k_overhead) (each tile's
  prologue and epilogue: loading the pipeline, writing its output), taking the best tile shape
  as cuBLAS's heuristics do;
- memory: reading both operands and writing the output once at achievable HBM bandwidth
  (attention's batched GEMMs with head_dim 64-128 are often here).

A memory-bound kernel (norms, softmax, dropout, element-wise ops, the optimizer) moves its bytes
at ``hbm_efficiency`` x the datasheet bandwidth. Every kernel also pays ``kernel_overhead``: the
gap between back-to-back kernels (launch, ramp-up, tail) that no bandwidth explains.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

# Candidate thread-block tiles (M, N) of cuBLAS/CUTLASS tensor-core kernels.
TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
# A tile of a x b output elements does a·b multiply-adds per a + b operand elements loaded per k
# step; the 128 x 128 tile (64 per element) is taken as enough to keep the tensor cores fed, smaller
# ones lose in proportion (128x64: 2/3, 64x64: 1/2).
_FULL_INTENSITY = 64.0


def tile_efficiency(tm: int, tn: int) -> float:
    return min(1.0, tm * tn / (tm + tn) / _FULL_INTENSITY)


@dataclass(frozen=True)
class KernelModel:
    """How a GPU runs kernels: set once per device class, each constant with its source."""

    sms: int  # streaming multiprocessors: tiles run ceil(tiles / sms) waves
    gemm_efficiency: float  # of dense peak, for large aligned GEMMs
    hbm_efficiency: float  # of datasheet HBM bandwidth, for streaming kernels
    kernel_overhead: float  # seconds per kernel
    k_overhead: int = 64  # K-equivalent of a tile's prologue + epilogue
    source: str = ""
    fp8_gemm_efficiency: float | None = None  # of the FP8 peak, where measured (a GPU profile); None: gemm_efficiency

    def for_fp8(self) -> "KernelModel":
        """The model an FP8 GEMM is priced with (at the device's FP8 peak)."""
        if self.fp8_gemm_efficiency is None:
            return self
        return dataclasses.replace(self, gemm_efficiency=self.fp8_gemm_efficiency)


@dataclass(frozen=True)
class Gemm:
    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    itemsize: int = 2
    io_bytes: float | None = None  # memory traffic when not the operands and output once (flash attention)
    fp8: bool = False  # run at the device's FP8 peak (Transformer Engine's linear layers)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        if self.io_bytes is not None:
            return self.io_bytes
        return float(self.batch * (self.m * self.k + self.k * self.n + self.m * self.n) * self.itemsize)


@dataclass(frozen=True)
class MemoryBound:
    name: str
    bytes: float


Kernel = Gemm | MemoryBound


@lru_cache(maxsize=65536)
def gemm_time(g: Gemm, peak: float, hbm: float, model: KernelModel) -> float:
    best = math.inf
    for tm, tn in TILES:
        tiles = g.batch * math.ceil(g.m / tm) * math.ceil(g.n / tn)
        waves = math.ceil(tiles / model.sms)
        # the time of ``waves`` full waves of tiles, each tile k deep plus its fixed overhead
        per_tile = 2.0 * tm * tn * (g.k + model.k_overhead) / (peak * model.gemm_efficiency / model.sms)
        best = min(best, waves * per_tile / tile_efficiency(tm, tn))
    return max(best, g.bytes / (hbm * model.hbm_efficiency)) + model.kernel_overhead


def kernel_time(kernel: Kernel, peak: float, hbm: float, model: KernelModel) -> float:
    if isinstance(kernel, Gemm):
        return gemm_time(kernel, peak, hbm, model)
    return kernel.bytes / (hbm * model.hbm_efficiency) + model.kernel_overhead
