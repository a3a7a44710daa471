"""A2 - your ZeRO memory estimator. `pytest assignments/a2` grades it.

Count only model states (parameters, gradients, optimizer states), in bytes, per data-parallel
rank. Mixed precision (bf16-mixed, fp16-mixed) keeps 2-byte parameters and gradients plus an fp32
master copy of the parameters held with the optimizer states; fp32 keeps 4-byte parameters and
gradients and no master. Adam keeps two fp32 states per parameter (m and v), SGD with momentum
one, plain SGD none.
"""

from __future__ import annotations


def model_states(params: int, strategy: str, gpus: int, precision: str = "bf16-mixed",
                 optimizer: str = "adam") -> dict:
    """Bytes per rank as {"gpu": ..., "host": ..., "nvme": ...} for `strategy` one of
    ddp, zero1 (optimizer states sharded), zero2 (+ gradients), zero3 (+ parameters),
    zero2-offload / zero3-offload (optimizer states and their step on the CPU: the host holds the
    rank's optimizer shard and its reduced gradient shard - in fp32 also its own fp32 copy of the
    parameter shard - and the GPU keeps only the parameters, sharded for zero3),
    zero3-infinity (parameters and optimizer states on NVMe, the gradient shard in host memory,
    nothing on the GPU between uses)."""
    raise NotImplementedError("A2: write model_states")
