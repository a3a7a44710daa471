"""A2 reference: bytes of model states per GPU (and off the GPU) for every ZeRO stage and offload."""

from __future__ import annotations

WEIGHT_BYTES = {"fp32": 4, "bf16-mixed": 2, "fp16-mixed": 2}
OPTIMIZER_BYTES = {"adam": 8, "sgd": 0, "sgd-momentum": 4}  # per parameter, fp32 states


def model_states(params: int, strategy: str, gpus: int, precision: str = "bf16-mixed",
                 optimizer: str = "adam") -> dict:
    """{"gpu", "host", "nvme"}: bytes per rank. Mixed precision keeps an fp32 master (4 bytes) with
    the optimizer states: Adam in bf16 is 2 + 2 + (4 + 8) = 16 bytes per parameter unsharded."""
    w = WEIGHT_BYTES[precision]
    k = OPTIMIZER_BYTES[optimizer] + (4 if w == 2 else 0)
    p, g, o = w * params, w * params, k * params
    n = gpus
    if strategy == "ddp":
        return {"gpu": p + g + o, "host": 0, "nvme": 0}
    if strategy == "zero1":
        return {"gpu": p + g + o / n, "host": 0, "nvme": 0}
    if strategy == "zero2":
        return {"gpu": p + (g + o) / n, "host": 0, "nvme": 0}
    if strategy == "zero3":
        return {"gpu": (p + g + o) / n, "host": 0, "nvme": 0}
    host_params = 0 if w == 2 else 4 * params / n  # in fp32 the CPU keeps its own copy of the shard
    if strategy == "zero2-offload":
        return {"gpu": p, "host": o / n + g / n + host_params, "nvme": 0}
    if strategy == "zero3-offload":
        return {"gpu": p / n, "host": o / n + g / n + host_params, "nvme": 0}
    if strategy == "zero3-infinity":
        return {"gpu": 0, "host": g / n, "nvme": (o + p) / n}
    raise ValueError(f"unknown strategy {strategy!r}")
