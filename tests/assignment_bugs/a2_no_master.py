"""Planted bug: mixed precision without the fp32 master copy (12 bytes of Adam become 8)."""
from instructor.solutions.a2 import model_states as _right


def model_states(params, strategy, gpus, precision="bf16-mixed", optimizer="adam"):
    right = _right(params, strategy, gpus, precision, optimizer)
    if precision == "fp32":
        return right
    master = 4 * params / (gpus if strategy != "ddp" else 1)
    place = "nvme" if strategy == "zero3-infinity" else "host" if strategy.endswith("offload") else "gpu"
    return {**right, place: right[place] - master}
