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


def moe_model(args, model: ModelSpec) -> ModelSpec:
    """The model with --experts, --top-k and --capacity-factor applied (checked: models/moe.py)."""
    changes = {}
    if getattr(args, "experts", None) is not None:
        changes["experts"] = units.positive_int(args.experts, "--experts")
    if getattr(args, "top_k", None) is not None:
        changes["top_k"] = units.positive_int(args.top_k, "--top-k")
    if getattr(args, "capacity_factor", None) is not None:
        changes["capacity_factor"] = _capacity(args.capacity_factor)
    if not changes:
        return model
    if not model.experts and "experts" not in changes:
        raise SimparError(f"--{next(iter(changes)).replace('_', '-')}: {model.name} is dense; give --experts too")
    return dataclasses.replace(model, **changes)


def moe_options(args) -> dict:
    """StrategySpec fields of the flags given (those left out keep their defaults)."""
    options = {}
    if getattr(args, "ep", None) is not None:
        options["ep"] = units.positive_int(args.ep, "--ep")
    if getattr(args, "expert_imbalance", None) is not None:
        options["expert_imbalance"] = units.positive(args.expert_imbalance, "--expert-imbalance")
    if getattr(args, "a2a_algo", None) is not None:
        options["alltoall_algo"] = args.a2a_algo.strip().lower()
    if getattr(args, "zeropp_qwz", False):
        options["zeropp_qwz"] = True
    if getattr(args, "zeropp_qgz", False):
        options["zeropp_qgz"] = True
    if getattr(args, "zeropp_hpz", None) is not None:
        options["zeropp_hpz"] = units.positive_int(args.zeropp_hpz, "--zeropp-hpz", minimum=0)
    if getattr(args, "shard_size", None) is not None:
        options["shard_size"] = units.positive_int(args.shard_size, "--shard-size")
    return options
