"""The flags of Mixture-of-Experts, expert parallelism, ZeRO++ and hybrid sharding, shared by run and search."""

from __future__ import annotations

import dataclasses

from simpar import units
from simpar.errors import SimparError
from simpar.models import ModelSpec


def add_moe_flags(p) -> None:
    moe = p.add_argument_group("Mixture-of-Experts and expert parallelism")
    moe.add_argument("--experts", help="routed experts per MoE layer (default: the model's; a dense model becomes "
                                       "MoE with its MLP as each expert)")
    moe.add_argument("--top-k", help="experts a token goes to (default: the model's, else 2)")
    moe.add_argument("--capacity-factor", help="each expert takes at most factor x top-k x seq / experts copies of a "
                                               "sequence's tokens, buffers padded to it, the rest dropped; 'none' "
                                               "routes without dropping (default: the model's)")
    moe.add_argument("--ep", help="expert-parallel degree: each MoE layer's experts split over this many of the dp "
                                  "ranks, tokens sent to them and back by all-to-all (default 1)")
    moe.add_argument("--expert-imbalance", help="the busiest expert's load over the mean, 1 (uniform, default) to "
                                                "experts / top-k: pads buffers without a capacity factor, drops "
                                                "tokens beyond one")
    moe.add_argument("--a2a-algo", help="all-to-all algorithm: pairwise (default) or hierarchical (inside nodes, "
                                        "then across)")
    zero = p.add_argument_group("ZeRO++ (zero3) and hybrid sharding (hsdp)")
    zero.add_argument("--zeropp-qwz", action="store_true", help="ZeRO++ qwZ: gather int8 weights")
    zero.add_argument("--zeropp-hpz", metavar="RANKS", help="ZeRO++ hpZ: a secondary weight partition over RANKS "
                                                           "ranks of a node for backward's gathers (e.g. 8)")
    zero.add_argument("--zeropp-qgz", action="store_true", help="ZeRO++ qgZ: reduce-scatter int4 gradients, "
                                                                "inside the node first")
    zero.add_argument("--shard-size", help="hsdp: ranks one shard spans (default: a node's GPUs)")


def _capacity(text: str) -> float | None:
    if text.strip().lower() in ("none", "dropless", "0"):
        return None if text.strip().lower() != "0" else 0.0
    try:
        return float(text)
    except ValueError:
        raise SimparError(f"--capacity-factor: expected a number or 'none', got {text!r}") from None


# flag (argparse's attribute) -> (field, parser): ModelSpec's MoE fields, then StrategySpec's
MODEL_FLAGS = {"experts": ("experts", lambda v: units.positive_int(v, "--experts")),
               "top_k": ("top_k", lambda v: units.positive_int(v, "--top-k")),
               "capacity_factor": ("capacity_factor", _capacity)}
STRATEGY_FLAGS = {"ep": ("ep", lambda v: units.positive_int(v, "--ep")),
                  "expert_imbalance": ("expert_imbalance", lambda v: units.positive(v, "--expert-imbalance")),
                  "a2a_algo": ("alltoall_algo", lambda v: v.strip().lower()),
                  "zeropp_qwz": ("zeropp_qwz", bool), "zeropp_qgz": ("zeropp_qgz", bool),
                  "zeropp_hpz": ("zeropp_hpz", lambda v: units.positive_int(v, "--zeropp-hpz", minimum=0)),
                  "shard_size": ("shard_size", lambda v: units.positive_int(v, "--shard-size"))}


def _given(args, flags: dict) -> dict:
    """The fields of the flags given (left out: None, or False for a switch), parsed."""
    return {field: parse(getattr(args, flag)) for flag, (field, parse) in flags.items()
            if getattr(args, flag, None) not in (None, False)}


def moe_model(args, model: ModelSpec) -> ModelSpec:
    """The model with --experts, --top-k and --capacity-factor applied (checked: models/moe.py)."""
    changes = _given(args, MODEL_FLAGS)
    if not changes:
        return model
    if not model.experts and "experts" not in changes:
        raise SimparError(f"--{next(iter(changes)).replace('_', '-')}: {model.name} is dense; give --experts too")
    return dataclasses.replace(model, **changes)


def moe_options(args) -> dict:
    """StrategySpec fields of the flags given (those left out keep their defaults)."""
    return _given(args, STRATEGY_FLAGS)
