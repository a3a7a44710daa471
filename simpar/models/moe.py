"""Mixture-of-Experts routing as simpar prices and performs it.

Each sequence's tokens are routed on their own (a capacity *group* is one sequence, so any batching
of the same sequences routes and drops the same tokens, which is what lets the executor train
exactly like one process). An expert takes at most ``slots`` copies of a sequence's tokens:

    slots = ceil(f x top_k x seq / experts)

with f the capacity factor (GShard, Switch, DeepSpeed-MoE: buffers padded to the capacity, the copies
beyond it dropped) or, without one, the routing's imbalance (the busiest expert's load over the mean:
DeepSpeed-MoE's ``drop_tokens=False`` sizes the buffer to the busiest expert). Every expert's buffer
has the same slots, so an all-to-all of expert-parallel degree ep moves, per rank and per direction,

    experts x slots x b x hidden x bytes x (ep - 1) / ep  ~  tokens x top_k x hidden x bytes x f x (ep - 1) / ep
"""

from __future__ import annotations

import math

from simpar.errors import SimparError


def check_moe(model) -> None:
    """The MoE fields of a ModelSpec, each error naming the flag that sets it."""
    if model.experts < 1:
        raise SimparError(f"--experts: model {model.name}: must be at least 1, got {model.experts}")
    if not 1 <= model.top_k <= model.experts:
        raise SimparError(f"--top-k: model {model.name}: a token goes to 1 to experts ({model.experts}) experts, "
                          f"got {model.top_k}")
    if model.capacity_factor is not None and not model.capacity_factor > 0:
        raise SimparError(f"--capacity-factor: model {model.name}: must be above 0, got {model.capacity_factor}")
    if model.expert_ffn < 0 or model.shared_experts < 0:
        raise SimparError(f"--model: {model.name}: expert_ffn and shared_experts must be 0 or more")
    if not 0 <= model.dense_layers < model.layers:
        raise SimparError(f"--model: {model.name}: dense_layers must leave at least one MoE layer, got "
                          f"{model.dense_layers} of {model.layers}")


def check_imbalance(model, imbalance: float) -> None:
    """The busiest expert's load over the mean: 1 (uniform) to experts / top_k (every token picks it)."""
    most = model.experts / model.top_k if model.experts else 1.0
    if not 1.0 <= imbalance <= most:
        raise SimparError(f"--expert-imbalance: the busiest expert's load over the mean runs from 1 (uniform) "
                          f"to experts / top-k = {most:g}, got {imbalance:g}")


def buffer_factor(model, imbalance: float = 1.0) -> float:
    """f above: the capacity factor, or (routing without dropping) the imbalance."""
    return model.capacity_factor if model.capacity_factor is not None else imbalance


def slots(model, imbalance: float = 1.0, tp: int = 1) -> int:
    """Copies of one sequence's tokens each expert's buffer holds (with tensor parallelism, of the sequence's
    1/tp that a rank routes: Megatron's MoE layers take sequence-parallel input)."""
    return math.ceil(round(buffer_factor(model, imbalance) * model.top_k * model.seq / tp / model.experts, 9))


def buffer_rows(model, micro_batch: int, imbalance: float = 1.0, tp: int = 1) -> int:
    """Token copies in one rank's dispatch buffer (every expert's slots for its micro-batch's sequences):
    what its experts compute on, the padding included, and what the all-to-all moves."""
    return model.experts * slots(model, imbalance, tp) * micro_batch


def dropped_share(model, imbalance: float = 1.0) -> float:
    """Share of the token copies dropped: the busiest expert's beyond its capacity (the others, sharing
    what is left equally, stay within theirs); 0 without a capacity factor."""
    if model.capacity_factor is None:
        return 0.0
    return max(0.0, imbalance - model.capacity_factor) / model.experts


def executor_activation_bytes(model, micro_batch: int, w: int, imbalance: float = 1.0) -> float:
    """Bytes simpar's executor MoE layer (real/moe.py) saves for backward, as its saved-tensor hooks count them
    (measured over experts 4 and 8, top-k 1 to 4, capacity factors 1.5 and 3, GELU and SwiGLU, fp32): the
    attention half of a dense layer's (ModelSpec.executor_activation_bytes without the ffn-wide tensors);
    per token copy picked back (top_k a token) its expert output, w·h, and 68 bytes of routing (indices,
    masks, weights); per buffer row the expert's input and its ffn-wide tensors (2 for GELU, 4 for SwiGLU);
    per token the shared experts' ffn-wide tensors; 8 bytes a sequence. (A copy dropped beyond its expert's
    capacity saves 24 bytes less, its three dispatch indices: the count assumes none is.)"""
    tokens = micro_batch * model.seq
    wide = 4 if model.activation == "swiglu" else 2
    attention = model.executor_activation_bytes("layer", micro_batch, w) - tokens * w * wide * model.ffn
    rows = buffer_rows(model, micro_batch, imbalance)
    return (attention + tokens * model.top_k * (w * model.hidden + 68)
            + rows * w * (model.hidden + wide * model.expert_width)
            + tokens * model.shared_experts * wide * model.expert_width * w + 8 * micro_batch)


def step_summary(scenario) -> dict:
    """What a step's routing does, for reports: the buffers' slots, the all-to-all calls, dropped copies."""
    model, spec, train = scenario.model, scenario.strategy, scenario.train
    imbalance = spec.expert_imbalance
    copies = train.global_batch * model.seq * model.top_k * model.moe_layers  # token copies routed a step
    return {"experts": model.experts, "top_k": model.top_k, "ep": spec.ep, "capacity_factor": model.capacity_factor,
            "imbalance": imbalance, "slots_per_sequence": slots(model, imbalance, spec.tp), "tp": spec.tp,
            "token_copies_per_step": copies, "dropped_share": dropped_share(model, imbalance),
            "dropped_copies_per_step": round(copies * dropped_share(model, imbalance))}
