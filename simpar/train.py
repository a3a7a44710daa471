"""How a model is trained: batch sizes, precision and optimizer, and what they cost per parameter."""

from __future__ import annotations

from dataclasses import dataclass

from simpar.errors import SimparError

PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp8-mixed", "fp32")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
# fp32 optimizer state bytes per parameter (besides an fp32 master copy in mixed precision)
_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 0, "sgd-momentum": 4}


@dataclass(frozen=True)
class TrainSpec:
    global_batch: int = 8
    micro_batch: int = 1
    precision: str = "bf16-mixed"
    optimizer: str = "adam"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise SimparError(f"--precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.optimizer not in OPTIMIZERS:
            raise SimparError(f"--optimizer: must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        for field in ("global_batch", "micro_batch"):
            if getattr(self, field) < 1:
                raise SimparError(f"--{field.replace('_', '-')}: must be at least 1")

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    @property
    def compute_dtype(self) -> str:
        """The dtype the GPU's matrix units run (and whose peak MFU is measured against); fp8-mixed runs the
        layers' linear GEMMs in FP8 (``fp8``) and everything else in bf16."""
        return {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "fp8-mixed": "bf16", "fp32": "fp32"}[self.precision]

    @property
    def fp8(self) -> bool:
        """Transformer Engine's FP8 training: the transformer layers' linear GEMMs (QKV, attention output, MLP
        up and down; forward, data and weight gradients) in FP8 with per-tensor scaling; attention, norms,
        embedding and head in bf16; bf16 weights, fp32 main gradients and optimizer states as bf16-mixed."""
        return self.precision == "fp8-mixed"

    @property
    def weight_bytes(self) -> int:
        """Bytes per parameter of the weights the forward pass reads (and of their gradients)."""
        return 2 if self.mixed else 4

    @property
    def optimizer_bytes(self) -> int:
        """K: optimizer bytes per parameter. Mixed-precision Adam: fp32 master 4 + m 4 + v 4 = 12."""
        return _STATE_BYTES[self.optimizer] + (4 if self.mixed else 0)

    def grad_accumulation(self, dp: int) -> int:
        """Micro-batches per rank per step; the global batch must split evenly."""
        per_step = self.micro_batch * dp
        if self.global_batch % per_step:
            raise SimparError(f"--global-batch: {self.global_batch} is not divisible by micro-batch "
                              f"{self.micro_batch} x data-parallel {dp} = {per_step}")
        return self.global_batch // per_step
