"""Context parallelism: each sequence split over ``cp`` ranks that hold the same weights (Megatron's cp group,
between TP and DP), so activations and all token-wise work fall by cp; only attention needs the others' tokens.

- Ring attention (Liu et al. 2023; Megatron-Core / Transformer Engine's p2p CP): a rank keeps its queries and
  passes its key/value block round the cp ring, cp - 1 exchanges a pass, each overlapped with the attention
  of the block it holds. Zig-zag placement (rank i holds sequence chunks i and 2cp-1-i) gives every rank the
  same share of the causal mask, so each block is 1/cp^2 of the layer's attention. Backward passes the blocks
  round again and, beside them, the partial key/value gradients (cp - 1 each); full recomputation repeats the
  forward's exchanges.
- Ulysses (Jacobs et al. 2023, DeepSpeed-Ulysses): an all-to-all turns the rank's s/cp tokens of all heads
  into all s tokens of heads/cp (Q, K and V), attention runs whole on them, and an all-to-all turns the
  context back; backward mirrors both. Needs the heads (and key/value heads) divisible by tp x cp.

The layer's piece that holds the attention core (strategies/megatron.py) runs as "X/pre" (up to and with the
QKV GEMM), the core (ring: cp blocks "X/core"; Ulysses: one), then "X/post" (costs/kernels.py prices each).
Gradients are reduced over dp x cp (the Grid's dp group counts both).
"""

from __future__ import annotations

from simpar.errors import SimparError
from simpar.plan import Collective, Compute, Program

CP_ALGOS = ("ring", "ulysses")
CP_STRATEGIES = ("pp", "tp", "3d")


def check_context(model, spec) -> None:
    """Errors name the flag: --cp, --cp-algo."""
    if spec.cp_algo not in CP_ALGOS:
        raise SimparError(f"--cp-algo: must be one of {', '.join(CP_ALGOS)}, got {spec.cp_algo!r}")
    if spec.cp == 1:
        return
    if spec.name not in CP_STRATEGIES:
        raise SimparError(f"--cp: context parallelism runs in Megatron's layouts; use --strategy 3d (or pp, tp) "
                          f"with --dp, not {spec.name}")
    if model.experts:
        raise SimparError(f"--cp: {model.name}'s MoE layers are not split by context parallelism here; use a dense "
                          "model or leave out --cp")
    if spec.schedule.startswith("zb-"):
        raise SimparError(f"--cp: {spec.schedule}'s split backward is not combined with context parallelism yet; "
                          "use 1f1b or interleaved")
    if spec.cp_algo == "ring" and model.seq % (2 * spec.cp):
        raise SimparError(f"--cp: ring attention's zig-zag placement splits the sequence into 2 x cp chunks; "
                          f"{model.name}'s sequence of {model.seq} is not divisible by {2 * spec.cp}")
    if spec.cp_algo == "ulysses":
        if model.seq % spec.cp:
            raise SimparError(f"--cp: {model.name}'s sequence of {model.seq} is not divisible by cp {spec.cp}")
        for what, count in (("heads", model.heads), ("key/value heads", model.n_kv_heads)):
            if count % (spec.tp * spec.cp):
                raise SimparError(f"--cp: Ulysses gives each rank heads / (tp x cp); {model.name}'s {count} {what} "
                                  f"are not divisible by tp {spec.tp} x cp {spec.cp}")


def has_core(work, unit: int, part: str) -> bool:
    """Whether a piece of a unit holds the attention core (a layer's whole, or TP's attention piece)."""
    return work.cp > 1 and 0 < unit < work.num_units - 1 and part in ("", "attn", "attn_core")


def kv_block_bytes(work) -> int:
    """A rank's key/value block: 2 x its s/cp tokens x the TP rank's key/value width."""
    return 2 * work.tokens * work.model.kv_dim // work.tp * work.w


def ulysses_bytes(work, which: str) -> int:
    """One rank's all-to-all buffer: Q, K and V of its tokens ("qkv"), or the attention's context ("context")."""
    width = work.model.hidden + 2 * work.model.kv_dim if which == "qkv" else work.model.hidden
    return work.tokens * width // work.tp * work.w


def _call(prog: Program, work, op: str, nbytes: int, deps, payload: str) -> int:
    algo = "ring" if op == "shift" else work.alltoall_algo
    return prog.add(Collective, "comm", deps, op=op, group="cp", nbytes=nbytes, algo=algo, payload=payload,
                    itemsize=work.w)


def _compute(prog, work, unit, mb, phase, part, deps) -> int:
    flops, nbytes = work.piece_work(phase, part)
    return prog.add(Compute, "compute", deps, phase=phase, unit=unit, microbatch=mb, part=part, flops=flops,
                    bytes=nbytes)


def attention(prog: Program, work, unit: int, mb: int, phase: str, part: str, deps) -> int:
    """The piece holding the attention core under context parallelism; returns its last op."""
    where = f"unit{unit} mb{mb}"
    if phase == "fwd":
        pre = _compute(prog, work, unit, mb, phase, f"{part}/pre", deps)
        core = _core(prog, work, unit, mb, phase, part, [pre], where)
        return _compute(prog, work, unit, mb, phase, f"{part}/post", core)
    post = _compute(prog, work, unit, mb, phase, f"{part}/post", deps)
    core = _core(prog, work, unit, mb, phase, part, [post], where)
    return _compute(prog, work, unit, mb, phase, f"{part}/pre", core)


def _core(prog, work, unit, mb, phase, part, deps, where) -> list[int]:
    if work.cp_algo == "ulysses":
        first, last = ("qkv", "context") if phase == "fwd" else ("context", "qkv")
        name = "" if phase == "fwd" else " grads"
        swap = [_call(prog, work, "alltoall", ulysses_bytes(work, first), deps, f"{first}{name} {where}")]
        core = [_compute(prog, work, unit, mb, phase, f"{part}/core", swap)]
        return [_call(prog, work, "alltoall", ulysses_bytes(work, last), core, f"{last}{name} {where}")]
    # ring: block k's attention waits for the k-th exchange; backward sends each block's partial key/value
    # gradients on after computing them
    block, shift, grads = deps, deps, []
    for k in range(work.cp):
        if k:
            shift = [_call(prog, work, "shift", kv_block_bytes(work), shift, f"kv block {where}")]
        block = [_compute(prog, work, unit, mb, phase, f"{part}/core", block + (shift if k else []))]
        if phase == "bwd" and k < work.cp - 1:
            grads = [_call(prog, work, "shift", kv_block_bytes(work), block + grads, f"kv grads {where}")]
    return block + grads


def recompute_calls(prog: Program, work, unit: int, mb: int, deps) -> list:
    """Full recomputation's forward repeats its exchanges before the backward."""
    where = f"recompute unit{unit} mb{mb}"
    if work.cp_algo == "ulysses":
        deps = [_call(prog, work, "alltoall", ulysses_bytes(work, "qkv"), deps, f"qkv {where}")]
        return [_call(prog, work, "alltoall", ulysses_bytes(work, "context"), deps, f"context {where}")]
    for _ in range(work.cp - 1):
        deps = [_call(prog, work, "shift", kv_block_bytes(work), deps, f"kv block {where}")]
    return deps
