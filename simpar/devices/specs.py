"""What a device can do, as frozen dataclasses (one per SKU, like a datasheet row)."""

from __future__ import annotations

from dataclasses import dataclass, field

from simpar.costs.gpu import KernelModel
from simpar.errors import SimparError

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class GPUSpec:
    """A GPU: dense peak FLOP/s per dtype, the fraction of it large GEMMs reach, and HBM.

    ``None`` for a dtype means the chip has no fast path for it (e.g. V100 has no bf16).
    """

    name: str
    fp32_flops: float
    tf32_flops: float | None
    fp16_flops: float
    bf16_flops: float | None
    achievable_fraction: float  # of peak, typical for large matmuls; calibration replaces it
    memory_bytes: int
    memory_bandwidth: float  # bytes/s
    source: str = ""  # where the numbers come from
    # Calibrated instead of a roofline: phase (fwd, bwd, step) -> ({unit kind: overhead_s}, work per
    # second), work being FLOPs, or parameters for the optimizer step (simpar calibrate; None for
    # datasheet GPUs). Unit kinds: embedding, layer, head.
    costs: dict | None = field(default=None, compare=False, hash=False)
    # How it runs kernels (GEMM efficiency by shape, HBM efficiency, launch overhead): a GPU's compute
    # is priced kernel by kernel (simpar.costs); None: a roofline over each op's FLOPs and bytes.
    kernels: KernelModel | None = field(default=None, compare=False, hash=False)
    fp8_flops: float | None = None  # dense FP8 (E4M3/E5M2) tensor-core peak; None before Hopper

    def peak_flops(self, dtype: str) -> float:
        if dtype not in DTYPES:
            raise SimparError(f"dtype: unknown {dtype!r}; choose from {', '.join(DTYPES)}")
        rate = getattr(self, f"{dtype}_flops")
        if rate is None:
            raise SimparError(f"dtype: {self.name} has no {dtype} support")
        return rate

    def flops(self, dtype: str) -> float:
        """Achievable FLOP/s for ``dtype``: what compute time should be priced with."""
        return self.peak_flops(dtype) * self.achievable_fraction


@dataclass(frozen=True)
class HostSpec:
    """The CPU side of a node: DRAM, cores, and how fast it runs an Adam update (ZeRO-Offload)."""

    name: str
    cores: int
    memory_bytes: int
    memory_bandwidth: float  # bytes/s
    fp32_flops: float  # peak, all cores
    adam_params_per_s: float  # parameters updated per second by a vectorised CPU Adam
    source: str = ""


@dataclass(frozen=True)
class NVMeSpec:
    """Local NVMe storage (ZeRO-Infinity's third tier)."""

    name: str
    capacity_bytes: int
    read_bandwidth: float  # bytes/s
    write_bandwidth: float  # bytes/s
    source: str = ""
