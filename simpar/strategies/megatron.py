"""Megatron-style model parallelism: pipeline stages (pp), tensor-parallel layers (tp), and data
parallelism (dp) across copies of the pipeline, with ZeRO-1 across the DP group.

Tensor parallelism (Shoeybi et al. 2019): attention heads and the MLP's ffn columns split t ways,
so each layer runs t times fewer FLOPs per rank but needs two all-reduces of its b·s·h output in
forward (after attention, after the MLP) and two of the input gradients in backward; the
vocabulary-parallel embedding adds one in forward, the vocabulary-parallel head one of its input
gradient in backward and two small ones (b·s fp32 maxima, then 2·b·s fp32 sums) for the
cross-entropy. They sit on the critical path: compute waits. Replicated norms and biases see the
same all-reduced inputs and gradients on every TP rank, so they need no communication.

Pipeline parallelism: each stage is one Program (its dp x tp ranks are identical); activations
go forward and their gradients back with Send/Recv, in the order of the chosen schedule.
With sequence parallelism (Korthikanti et al. 2022) each TP all-reduce is a reduce-scatter and an
all-gather over the sequence, and after the last backward the gradients of the parameters every TP
rank holds whole (norms, row-parallel biases) are all-reduced over the TP group. After the last
backward, gradients are reduce-scattered across the DP group, each rank updates
its optimizer shard and the parameters are all-gathered (ZeRO-1), as with --strategy zero1.
"""

from __future__ import annotations

from simpar.plan import Collective, Compute, Grid, Plan, Program, Recv, Send
from simpar.scenario import Scenario
from simpar.strategies import context, experts
from simpar.strategies.experts import grad_calls
from simpar.strategies.pipeline import SCHEDULES, SPLIT_BACKWARD, stage_of, virtual_stage
from simpar.strategies.work import Work, buckets


def stage_units(work: Work, virtual_stage: int, virtual_stages: int) -> list[int]:
    """Units of one virtual stage: its share of the layers, plus the embedding on the first and
    the head on the last."""
    per = work.layers // virtual_stages
    units = list(range(1 + virtual_stage * per, 1 + (virtual_stage + 1) * per))
    if virtual_stage == 0:
        units.insert(0, 0)
    if virtual_stage == virtual_stages - 1:
        units.append(work.num_units - 1)
    return units


def build(scenario: Scenario) -> Plan:
    spec = scenario.strategy
    grid = Grid(spec.replicas, spec.pp, spec.tp, ep=spec.ep, cp=spec.cp)
    work = Work(scenario)
    p, v, m = spec.pp, spec.chunks, scenario.microbatches
    hidden_bytes = work.tokens * scenario.model.hidden * work.w  # (the rank's tokens: s / cp of each sequence)
    programs = []
    for stage in range(p):
        prog = Program(grid.stage_ranks(stage), name=f"stage {stage}")
        chunks = [stage_units(work, virtual_stage(spec.schedule, stage, c, p), p * v) for c in range(v)]
        held = [u for chunk in chunks for u in chunk]
        params = work.params(held)
        ready = _gather_params_ahead(prog, work, spec, held)  # unit -> the all-gathers its first forward waits for
        work.static(prog, work.w * params, work.g * params, work.k * work.shard(held, spec.replicas))
        layers = _dense_layers(work, held)
        if work.fp8_weight_bytes and layers:
            prog.alloc("compute", "buffers", work.fp8_weight_bytes * layers, payload="fp8 weights")
        last = None
        link = _Links(spec.schedule, p)
        for kind, mb, chunk in SCHEDULES[spec.schedule](stage, p, m, v, times=work.pass_times()):
            vs = virtual_stage(spec.schedule, stage, chunk, p)
            if kind == "F":
                last = _forward(prog, work, chunks[chunk], mb, vs, p * v, hidden_bytes, spec.tp, spec.sequence_parallel,
                                link, ready if mb == 0 else {})
            elif kind == "W":
                last = _weight_grads(prog, work, chunks[chunk], mb)
            else:
                last = _backward(prog, work, chunks[chunk], mb, vs, hidden_bytes, spec.tp, spec.sequence_parallel,
                                 (spec.tp_comm_overlap or spec.tp_comm_userbuffers) and spec.tp > 1, link,
                                 spec.schedule in SPLIT_BACKWARD)
        if spec.sequence_parallel and spec.tp > 1:
            # Megatron (finalize_model_grads): the norms' and row-parallel biases' gradients saw only this
            # rank's part of the sequence; summing them over the TP group makes the replicas agree
            replicated = sum(work.units[u].replicated for u in held)
            last = _tp(prog, work, "allreduce", work.g * replicated, [last], "sequence-parallel grads", work.g)
        if spec.replicas > 1:
            _reduce_and_step(prog, work, scenario, held, last, gathered_ahead=bool(ready))
        else:
            work.gpu_step(prog, params, deps=[last])
        programs.append(prog)
    return Plan(spec.name, grid, programs)


class _Links:
    """Where a pipeline's data goes between two virtual stages: the peer (``next`` or ``prev`` stage) the
    sender sends to, or with ``receiver`` the peer the receiver takes it from; None where both virtual stages
    are on one stage (ZB-V turns round on the last stage)."""

    def __init__(self, schedule: str, stages: int):
        self.schedule, self.stages = schedule, stages

    def __call__(self, src: int, dst: int, receiver: bool = False) -> str | None:
        here, there = stage_of(self.schedule, src, self.stages), stage_of(self.schedule, dst, self.stages)
        if here == there:
            return None
        if self.schedule == "zb-v":
            forward = there > here
        else:
            forward = dst > src  # (interleaving wraps from the last stage to the first)
        return "next" if forward != receiver else "prev"


def _tp(prog: Program, work: Work, op: str, nbytes: int, deps, payload: str, itemsize: int | None = None) -> int:
    return prog.add(Collective, "comm", deps, op=op, group="tp", nbytes=nbytes, algo="ring", payload=payload,
                    itemsize=itemsize or work.w)


# A layer's pieces under tensor parallelism, each followed by its communication (costs/kernels.py
# prices the parts). Without sequence parallelism each half ends in an all-reduce; with it the
# sharded norm/dropout work ends in an all-gather and each half's GEMMs in a reduce-scatter.
LAYER_PIECES = {False: (("attn", "allreduce"), ("mlp", "allreduce")),
                True: (("attn_norm", "allgather"), ("attn_core", "reducescatter"),
                       ("mlp_norm", "allgather"), ("mlp_core", "reducescatter"))}
HEAD_PIECES = {False: (("", None),), True: (("norm", "allgather"), ("logits", None))}


def _pieces(work: Work, unit: int, tp: int, sp: bool):
    if tp == 1:
        return (("", None),)
    if work.split_moe(unit):  # the attention's sequence-parallel pieces; the MoE parts follow (experts.py)
        return LAYER_PIECES[True][:2]
    if unit == 0:  # vocabulary-parallel embedding: partial sums reduced (scattered over the sequence with sp)
        return (("", "reducescatter" if sp else "allreduce"),)
    if unit == work.num_units - 1:
        return HEAD_PIECES[sp]
    return LAYER_PIECES[sp]


# Backward mirrors forward: an all-gather's gradient is a reduce-scatter and the reverse; an all-reduce
# of partial outputs becomes an all-reduce of the partial input gradients at the piece's start.
_BACKWARD_OF = {"allgather": "reducescatter", "reducescatter": "allgather", "allreduce": "allreduce"}


def _piece(prog, work, unit, mb, phase, part, pieces, deps, input_only=False) -> int:
    """A piece's compute: its share of the unit's work (an MoE layer's: strategies/experts.py's parts);
    ``input_only``: a backward's input gradients, its weight gradients left to W (zero-bubble schedules)."""
    if work.split_moe(unit):
        return experts.part(prog, work, unit, mb, phase, part, deps)
    if context.has_core(work, unit, part):  # the attention core's exchanges (context parallelism)
        return context.attention(prog, work, unit, mb, phase, part, deps)
    u, fwd = work.units[unit], phase == "fwd"
    flops, nbytes = (u.fwd_flops, u.fwd_bytes) if fwd else (u.bwd_flops, u.bwd_bytes)
    if input_only:
        flops, nbytes, part = flops - u.wgrad_flops, nbytes - u.wgrad_bytes, f"{part}/input"
    return prog.add(Compute, "compute", deps, phase=phase, unit=unit, microbatch=mb, part=part,
                    flops=flops / pieces, bytes=nbytes / pieces)


def _forward(prog, work, units, mb, vs, virtual_stages, hidden_bytes, tp, sp, link, ready) -> int:
    boundary = hidden_bytes // tp if sp else hidden_bytes  # a TP rank's share of what crosses stages
    source = link(vs - 1, vs, receiver=True) if vs > 0 else None
    deps = [prog.add(Recv, "recv", peer=source, nbytes=boundary, tag=f"F mb{mb} vs{vs}",
                     microbatch=mb, units=tuple(units))] if source else []
    for unit in units:
        u = work.units[unit]
        if unit in ready:  # its parameters gathered ahead (--overlap-param-gather)
            deps = deps + ready[unit]
        if work.split_moe(unit) and tp == 1:  # an MoE layer's parts and all-to-alls
            deps = [work.forward(prog, unit, mb, deps)]
            continue
        if u.activations:
            prog.alloc("compute", "activations", u.activations, payload=f"unit{unit} mb{mb}")
        pieces = _pieces(work, unit, tp, sp)
        if work.userbuffers and 0 < unit < work.num_units - 1 and not work.split_moe(unit):
            deps = _overlapped_halves(prog, work, unit, mb, pieces, hidden_bytes, deps)
            pieces = ()
        for part, comm in pieces:
            deps = [_piece(prog, work, unit, mb, "fwd", part, len(pieces), deps)]
            if comm:
                deps = [_tp(prog, work, comm, hidden_bytes, deps, f"activations unit{unit} mb{mb}")]
        if work.split_moe(unit):  # then the MoE parts on this rank's share of the sequence
            deps = [experts.forward(prog, work, unit, mb, deps)]
        if tp > 1 and unit == work.num_units - 1:  # vocabulary-parallel cross-entropy: the logits' max, then
            tokens = hidden_bytes // (work.w * work.hidden)  # the sums of exp and of the target's logit
            for payload, nbytes in (("logits max", 4 * tokens), ("cross-entropy sums", 8 * tokens)):
                deps = [_tp(prog, work, "allreduce", nbytes, deps, f"{payload} mb{mb}", itemsize=4)]
    deps = _amax(prog, work, units, 2, deps, f"fp8 amax mb{mb}")
    target = link(vs, vs + 1) if vs < virtual_stages - 1 else None
    if target:
        prog.add(Send, "send", deps, peer=target, nbytes=boundary, tag=f"F mb{mb} vs{vs + 1}",
                 microbatch=mb, units=tuple(units))
    return deps[0]


def _overlapped_halves(prog, work, unit, mb, pieces, hidden_bytes, deps) -> list[int]:
    """A layer's forward with Megatron-Core's --tp-comm-overlap (Transformer Engine userbuffers, sequence
    parallel): each half's all-gather streams in chunk by chunk as its first GEMM consumes them, and its
    reduce-scatter streams out as its last GEMM produces them, so a half takes about the longer of its
    compute and its two collectives."""
    for (norm_part, gather), (core_part, scatter) in zip(pieces[::2], pieces[1::2]):
        norm = _piece(prog, work, unit, mb, "fwd", norm_part, len(pieces), deps)
        ag = _tp(prog, work, gather, hidden_bytes, [norm], f"activations unit{unit} mb{mb}")
        core = _piece(prog, work, unit, mb, "fwd", core_part, len(pieces), [norm])
        deps = [core, _tp(prog, work, scatter, hidden_bytes, [ag], f"activations unit{unit} mb{mb}")]
    return deps


def _backward(prog, work, units, mb, vs, hidden_bytes, tp, sp, overlap, link, split) -> int:
    """A chunk's backward; ``split`` (zero-bubble schedules): its input gradients only, the weight gradients
    left to ``_weight_grads``."""
    last_unit = work.num_units - 1
    boundary = hidden_bytes // tp if sp else hidden_bytes
    source = None if units[-1] == last_unit else link(vs + 1, vs, receiver=True)
    deps = [prog.add(Recv, "recv", peer=source, nbytes=boundary, tag=f"B mb{mb} vs{vs}",
                     microbatch=mb, units=tuple(units))] if source else []
    for unit in reversed(units):
        u = work.units[unit]
        if work.split_moe(unit) and tp == 1:
            deps = [work.backward(prog, unit, mb, deps)]
            continue
        if u.recompute_temp:
            prog.alloc("compute", "temporaries", u.recompute_temp, payload=f"recompute unit{unit} mb{mb}")
        pieces = _pieces(work, unit, tp, sp)
        if work.split_moe(unit):  # the MoE parts' backward comes first, then the attention's pieces
            deps = [experts.backward(prog, work, unit, mb, deps)]
        if work.recompute == "full" and 0 < unit < last_unit:  # recomputing a layer repeats its TP communication
            for _, comm in pieces:  # (and its context-parallel exchanges)
                if comm:
                    deps = [_tp(prog, work, comm, hidden_bytes, deps, f"recompute activations unit{unit} mb{mb}")]
            if work.cp > 1:
                deps = context.recompute_calls(prog, work, unit, mb, deps)
        layer = 0 < unit < last_unit
        for part, comm in reversed(pieces):
            # with sp, the gradient of the piece's output communication comes first (unless the async
            # reduce-scatter of the previous piece already moved it); userbuffers stream it into the part's
            # first data-gradient GEMM instead, and only the weight gradient waits for all of it
            streamed = overlap and layer and work.userbuffers and comm == "reducescatter"
            gathered = None
            if comm and comm != "allreduce" and not (overlap and layer and comm == "allgather"):
                gathered = _tp(prog, work, _BACKWARD_OF[comm], hidden_bytes, deps, f"output grads unit{unit} mb{mb}")
                deps = deps if streamed else [gathered]
            if overlap and layer and comm == ("reducescatter" if sp else "allreduce"):
                # Megatron's async TP communication: the input gradient of the part's first (column-parallel)
                # GEMM is all-reduced (reduce-scattered) while that GEMM's weight gradient computes
                rest = prog.add(Compute, "compute", deps, phase="bwd", unit=unit, microbatch=mb, part=f"{part}/rest",
                                flops=u.bwd_flops / len(pieces), bytes=u.bwd_bytes / len(pieces))
                done = [rest, gathered] if streamed else [rest]
                reduce = _tp(prog, work, "reducescatter" if sp else "allreduce", hidden_bytes, done,
                             f"input grads unit{unit} mb{mb}")
                deps = [reduce, prog.add(Compute, "compute", done, phase="bwd", unit=unit, microbatch=mb,
                                         part=f"{part}/wgrad")]
                continue
            deps = [_piece(prog, work, unit, mb, "bwd", part, len(pieces), deps, split and unit > 0)]
            if tp > 1 and unit > 0 and not sp:  # the partial input gradient of the column-parallel GEMMs
                deps = [_tp(prog, work, "allreduce", hidden_bytes, deps, f"input grads unit{unit} mb{mb}")]
        if u.recompute_temp:
            prog.free("compute", "temporaries", u.recompute_temp, payload=f"recompute unit{unit} mb{mb}")
        if u.activations:
            prog.free("compute", "activations", u.activations, payload=f"unit{unit} mb{mb}")
        if split and u.wgrad_held:  # what the weight gradients will read: the GEMMs' inputs and output gradients
            prog.alloc("compute", "temporaries", u.wgrad_held, payload=f"weight grads unit{unit} mb{mb}")
    deps = _amax(prog, work, units, 1, deps, f"fp8 grad amax mb{mb}")
    target = link(vs, vs - 1) if vs > 0 else None
    if target:
        prog.add(Send, "send", deps, peer=target, nbytes=boundary, tag=f"B mb{mb} vs{vs - 1}",
                 microbatch=mb, units=tuple(units))
    return deps[0]


def _dense_layers(work: Work, units) -> int:
    """How many of ``units`` are dense transformer layers (the ones whose linear GEMMs fp8-mixed runs in FP8)."""
    return sum(1 for u in units if work.model.unit_kind(u) == "layer")


def _amax(prog: Program, work: Work, units, per_gemm: int, deps, payload: str) -> list[int]:
    """FP8 delayed scaling (Transformer Engine): at the end of a chunk's forward (backward) the amax of each
    FP8 tensor, ``per_gemm`` a linear GEMM (input and weight; output gradient), is all-reduced as one fp32 buffer
    over the stage's data-, context- and tensor-parallel ranks, so that every replica scales alike."""
    layers = _dense_layers(work, units)
    if not (work.fp8_weight_bytes and layers and work.stage_size > 1):
        return deps
    return [prog.add(Collective, "comm", deps, op="allreduce", group="stage", nbytes=4 * 4 * per_gemm * layers,
                     algo="tree", payload=payload, itemsize=4)]


def _weight_grads(prog: Program, work: Work, units, mb: int) -> int:
    """W of a zero-bubble schedule: the chunk's weight-gradient GEMMs (the embedding's gradient came with its B)."""
    op = None
    for unit in reversed(units):
        u = work.units[unit]
        if unit == 0:
            continue
        op = prog.add(Compute, "compute", phase="bwd", unit=unit, microbatch=mb, part="/weight",
                      flops=u.wgrad_flops, bytes=u.wgrad_bytes)
        if u.wgrad_held:
            prog.free("compute", "temporaries", u.wgrad_held, payload=f"weight grads unit{unit} mb{mb}")
    return op


def _gather_params_ahead(prog: Program, work: Work, spec, held: list[int]) -> dict[int, list[int]]:
    """--overlap-param-gather: the parameters' all-gathers at the step's start, a bucket at a time in forward
    order; unit -> the ops its first forward waits for."""
    if not (spec.overlap_param_gather and spec.replicas > 1):
        return {}
    ready = {}
    for bucket in reversed(buckets(work, list(reversed(held)), spec.bucket_bytes)):
        calls = grad_calls(prog, work, "allgather", bucket, [], spec.algo or "ring", payload="params", stream="dp")
        ready.update(dict.fromkeys(bucket, calls))
    return ready


def _grads_done(prog: Program, bucket, last_mb: int) -> list[int]:
    """The ops computing ``bucket``'s gradients in the last micro-batch (its backward, W included)."""
    return [op.id for op in prog.ops if isinstance(op, Compute) and op.phase == "bwd" and op.unit in bucket
            and op.microbatch == last_mb]


def _reduce_and_step(prog: Program, work: Work, scenario: Scenario, held: list[int], last: int,
                     gathered_ahead: bool = False) -> None:
    """ZeRO-1 across the DP group: reduce-scatter the stage's gradients (with --overlap-grad-reduce each bucket
    as soon as the last micro-batch has computed it), step the shard, gather (unless gathered ahead)."""
    spec = scenario.strategy
    algo = spec.algo or "ring"
    reductions = []
    for bucket in buckets(work, list(reversed(held)), spec.bucket_bytes):
        if spec.overlap_grad_reduce:  # on the data-parallel communicator's own stream, beside TP's
            done = _grads_done(prog, bucket, scenario.microbatches - 1)
            reductions += grad_calls(prog, work, "reducescatter", bucket, done, algo, itemsize=work.g, stream="dp")
        else:
            reductions += grad_calls(prog, work, "reducescatter", bucket, [last], algo, itemsize=work.g)
    step = work.gpu_step(prog, int(work.shard(held, spec.replicas)), deps=reductions + [last])
    if not gathered_ahead:
        for bucket in buckets(work, list(reversed(held)), spec.bucket_bytes):  # the shards' buckets
            grad_calls(prog, work, "allgather", bucket, [step], algo, payload="params")
