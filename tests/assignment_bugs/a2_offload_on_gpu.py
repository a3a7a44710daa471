"""Planted bug: offload leaves the optimizer states on the GPU (only the gradients move)."""
from instructor.solutions.a2 import model_states as _right


def model_states(params, strategy, gpus, precision="bf16-mixed", optimizer="adam"):
    if strategy.endswith("-offload"):
        base = _right(params, strategy.replace("-offload", ""), gpus, precision, optimizer)
        w = 2 if precision != "fp32" else 4
        return {"gpu": base["gpu"] - w * params / gpus, "host": w * params / gpus, "nvme": 0}
    return _right(params, strategy, gpus, precision, optimizer)
