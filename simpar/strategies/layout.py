"""Checks of the layouts that carve the data-parallel group: expert parallelism (ep ranks share one
MoE layer's experts), ZeRO++'s secondary partition (hpZ) and hybrid sharding's shard (hsdp).

Each carves the dp ranks of one (stage, tp index) into contiguous blocks (``Grid``: groups "ep" and
"shard") and the strided groups across them ("edp", the ranks holding the same experts; "replica",
the ranks holding the same shard), so a block sits inside a node as Megatron and DeepSpeed place it.
"""

from __future__ import annotations

from simpar.errors import SimparError
from simpar.models.moe import check_imbalance

EXPERT_PARALLEL = ("ddp", "zero1", "zero2", "pp", "3d")  # strategies whose plans carry expert parallelism


def check_layout(model, spec) -> None:
    """Errors name the flag: --ep, --expert-imbalance, --zeropp-*, --shard-size."""
    if spec.ep < 1:
        raise SimparError(f"--ep: must be at least 1, got {spec.ep}")
    if spec.ep > 1:
        if not model.experts:
            raise SimparError(f"--ep: {model.name} is dense (no experts to split); give an MoE model "
                              "(mixtral-8x7b, deepseek-moe-16b, tiny-moe) or --experts")
        if model.experts % spec.ep:
            raise SimparError(f"--ep: {model.name}'s {model.experts} experts are not divisible by ep {spec.ep}")
        if spec.dp * spec.tp % spec.ep:
            raise SimparError(f"--ep: expert parallelism splits a stage's dp x tp ranks; dp {spec.dp} x tp "
                              f"{spec.tp} is not divisible by ep {spec.ep}")
        if spec.name not in EXPERT_PARALLEL:
            raise SimparError(f"--ep: expert parallelism is modelled with {', '.join(EXPERT_PARALLEL)}, not "
                              f"{spec.name}")
    if spec.alltoall_algo not in ("pairwise", "hierarchical"):
        raise SimparError(f"--a2a-algo: must be pairwise or hierarchical, got {spec.alltoall_algo!r}")
    if model.experts:
        check_imbalance(model, spec.expert_imbalance)
        if spec.tp > 1 and not spec.sequence_parallel:
            raise SimparError("--sequence-parallel: Megatron runs MoE layers with tensor parallelism on "
                              "sequence-parallel input only; add it")
        for flag, on in (("--tp-comm-overlap", spec.tp_comm_overlap),
                         ("--tp-comm-userbuffers", spec.tp_comm_userbuffers)):
            if on:
                raise SimparError(f"{flag}: not modelled for MoE layers; leave it out")
        if spec.tp > 1 and model.seq % spec.tp:
            raise SimparError(f"--tp: {model.name}'s sequence of {model.seq} does not split over tp {spec.tp}")
    elif spec.expert_imbalance != 1.0:
        raise SimparError(f"--expert-imbalance: {model.name} is dense (no experts)")
    for flag, on in (("--zeropp-qwz", spec.zeropp_qwz), ("--zeropp-hpz", spec.zeropp_hpz),
                     ("--zeropp-qgz", spec.zeropp_qgz)):
        if on and spec.name != "zero3":
            raise SimparError(f"{flag}: ZeRO++ changes ZeRO-3's collectives; use --strategy zero3, not {spec.name}")
    if spec.zeropp_hpz < 0 or spec.zeropp_hpz == 1 or (spec.zeropp_hpz and spec.dp % spec.zeropp_hpz):
        raise SimparError(f"--zeropp-hpz: the secondary partition spans 2 or more ranks dividing dp {spec.dp}, "
                          f"got {spec.zeropp_hpz}")
    if spec.zeropp and spec.gather_granularity == "module":
        raise SimparError("--gather-granularity: simpar models ZeRO++ gathering a layer at a time; leave it out")
    if spec.shard_size is not None:
        if spec.name != "hsdp":
            raise SimparError(f"--shard-size: the shard of hybrid sharding; use --strategy hsdp, not {spec.name}")
        if spec.shard_size < 1 or spec.dp % spec.shard_size:
            raise SimparError(f"--shard-size: must divide the {spec.dp} data-parallel ranks, got {spec.shard_size}")
