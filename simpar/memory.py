"""Closed-form memory per GPU: model states by ZeRO stage (Rajbhandari et al. 2020), activations.

With Φ parameters, N data-parallel ranks, weights and gradients of w bytes and K optimizer
bytes per parameter (mixed-precision Adam: w = 2, K = 12):
    ddp, dp:        params wΦ    grads wΦ    optimizer KΦ
    zero1:          params wΦ    grads wΦ    optimizer KΦ/N
    zero2:          params wΦ    grads wΦ/N  optimizer KΦ/N
    zero3:          params wΦ/N  grads wΦ/N  optimizer KΦ/N
*-offload keeps the (sharded) optimizer states in host memory instead, beside the gradient shard
copied down for the CPU's step (wΦ/N: the GPU holds each bucket's reduced shard only until it is
copied, a buffer rather than a model state) and, in fp32 where K holds no master copy, the CPU's own
copy of the parameter shard (4Φ/N); zero3-infinity keeps the parameter and optimizer shards on
NVMe (the gradient shard still lands in host memory). Activations are added by the caller from
the ModelSpec.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simpar.errors import SimparError
from simpar.train import TrainSpec

# (params, grads, optimizer): which model states are split across the data-parallel group
SHARDING = {
    "dp": (False, False, False), "ddp": (False, False, False),
    "zero1": (False, False, True), "zero2": (False, True, True), "zero3": (True, True, True),
    "zero2-offload": (False, True, True), "zero3-offload": (True, True, True),
    "zero3-infinity": (True, True, True),
}


@dataclass(frozen=True)
class Memory:
    params: float
    grads: float
    optimizer: float
    activations: float = 0.0
    host: float = 0.0  # bytes per rank kept in host memory (offload)
    nvme: float = 0.0  # bytes per rank kept on NVMe (ZeRO-Infinity)
    working: float = 0.0  # ZeRO-3: the largest module's gathered 16-bit weights and gradients

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.working + self.activations

    def to_json(self) -> dict:
        return {**asdict(self), "total": self.total}


def model_states(strategy: str, params: int, dp: int, train: TrainSpec = TrainSpec(),
                 deepspeed_habits: bool = False, offload_params: bool = False, largest_module: int = 0,
                 sub_group_size: int | None = None) -> Memory:
    """``deepspeed_habits``, ``offload_params`` and ``largest_module`` (parameters) count what DeepSpeed
    holds besides (see deepspeed_states)."""
    if strategy not in SHARDING:
        raise SimparError(f"--strategy: unknown {strategy!r}; choose from {', '.join(SHARDING)}")
    if dp < 1:
        raise SimparError(f"--gpus: must be at least 1, got {dp}")
    shard_params, shard_grads, shard_opt = SHARDING[strategy]
    w, k = train.weight_bytes, train.optimizer_bytes
    p = w * params / (dp if shard_params else 1)
    g = w * params / (dp if shard_grads else 1)
    o = k * params / (dp if shard_opt else 1)
    # DeepSpeed's fp32 gradient copy for the step: with mixed precision, and with ZeRO-3 in any precision
    fp32_grads = deepspeed_habits and shard_opt and (train.mixed or shard_params)
    if deepspeed_habits and not train.mixed and shard_opt:  # an fp32 master partition even in fp32 training
        o += 4 * params / dp
    working = 2 * w * largest_module if shard_params else 0
    host_grads = (4 if fp32_grads else w) * params / dp  # the reduced gradient shard the CPU's step takes
    if fp32_grads and shard_params:  # DeepSpeed's ZeRO-3 keeps its 16-bit gradient partition buffer beside it
        host_grads += w * params / dp
    if strategy.endswith("-offload"):
        host_params = 0 if train.mixed or deepspeed_habits else 4 * params / dp  # (DeepSpeed's master: in o)
        if offload_params:  # the 16-bit parameter shard lives in host memory too
            host_params, p = host_params + p, 0.0
        return Memory(p, 0.0, 0.0, host=o + host_grads + host_params, working=working)
    if strategy == "zero3-infinity":  # parameters and optimizer states live on NVMe
        return Memory(0.0, 0.0, 0.0, host=host_grads, nvme=o + p, working=working)
    if fp32_grads:  # beside the gradient partition; ZeRO-3 makes it a sub-group at a time
        stepped = min(params / dp, sub_group_size or params) if shard_params else params / dp
        g += 4 * stepped
    return Memory(p, g, o, working=working)


def largest_module(model) -> int:
    """Parameters of the model's largest module (its own, not its children's): what DeepSpeed's ZeRO-3
    estimator takes as the working set gathered at once (estimate_zero3_model_states_mem_needs_all_live)."""
    return max(n for kind in ("embedding", "layer", "head") for _, n in model.unit_modules(kind))
