"""Planted bug: ZeRO-2 shards the optimizer states but forgets the gradients."""
from instructor.solutions.a2 import model_states as _right


def model_states(params, strategy, gpus, precision="bf16-mixed", optimizer="adam"):
    return _right(params, "zero1" if strategy == "zero2" else strategy, gpus, precision, optimizer)
