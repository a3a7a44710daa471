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
After the last backward, gradients are reduce-scattered across the DP group, each rank updates
its optimizer shard and the parameters are all-gathered (ZeRO-1), as with --strategy zero1.
"""

from __future__ import annotations

from simpar.plan import Collective, Compute, Grid, Plan, Program, Recv, Send
from simpar.scenario import Scenario
from simpar.strategies.pipeline import SCHEDULES
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
    grid = Grid(spec.dp, spec.pp, spec.tp)
    work = Work(scenario)
    p, v, m = spec.pp, spec.virtual_stages, scenario.microbatches
    hidden_bytes = scenario.train.micro_batch * scenario.model.seq * scenario.model.hidden * work.w
    programs = []
    for stage in range(p):
        prog = Program(tuple(r for r in range(grid.world) if grid.coords(r)[0] == stage), name=f"stage {stage}")
        chunks = [stage_units(work, c * p + stage, p * v) for c in range(v)]
        held = [u for chunk in chunks for u in chunk]
        params = work.params(held)
        work.static(prog, work.w * params, work.w * params, work.k * params / spec.dp)
        last = None
        for kind, mb, chunk in SCHEDULES[spec.schedule](stage, p, m, v):
            vs = chunk * p + stage
            if kind == "F":
                last = _forward(prog, work, chunks[chunk], mb, vs, p * v, hidden_bytes, spec.tp)
            else:
                last = _backward(prog, work, chunks[chunk], mb, vs, hidden_bytes, spec.tp)
        if spec.dp > 1:
            _reduce_and_step(prog, work, scenario, held, last)
        else:
            work.gpu_step(prog, params, deps=[last])
        programs.append(prog)
    return Plan(spec.name, grid, programs)


def _tp_allreduce(prog: Program, work: Work, nbytes: int, deps, payload: str) -> int:
    return prog.add(Collective, "comm", deps, op="allreduce", group="tp", nbytes=nbytes, algo="ring",
                    payload=payload, itemsize=work.w)


def _forward(prog, work, units, mb, vs, virtual_stages, hidden_bytes, tp) -> int:
    deps = [prog.add(Recv, "recv", peer="prev", nbytes=hidden_bytes, tag=f"F mb{mb} vs{vs}",
                     microbatch=mb, units=tuple(units))] if vs > 0 else []
    for unit in units:
        u = work.units[unit]
        if u.activations:
            prog.alloc("compute", "activations", u.activations, payload=f"unit{unit} mb{mb}")
        halves = 2 if (tp > 1 and 0 < unit < work.num_units - 1) else 1
        for half in range(halves):  # attention, then MLP: each ends in an all-reduce under TP
            op = prog.add(Compute, "compute", deps, phase="fwd", unit=unit, microbatch=mb,
                          flops=u.fwd_flops / halves, bytes=u.fwd_bytes / halves)
            deps = [op]
            if tp > 1 and unit < work.num_units - 1:
                deps = [_tp_allreduce(prog, work, hidden_bytes, deps, f"activations unit{unit} mb{mb}")]
            elif tp > 1:  # vocabulary-parallel cross-entropy: the logits' max, then the sums of
                tokens = hidden_bytes // (work.w * work.hidden)  # exp and of the target's logit
                for payload, nbytes in (("logits max", 4 * tokens), ("cross-entropy sums", 8 * tokens)):
                    deps = [prog.add(Collective, "comm", deps, op="allreduce", group="tp", nbytes=nbytes,
                                     algo="ring", payload=f"{payload} mb{mb}", itemsize=4)]
    if vs < virtual_stages - 1:
        prog.add(Send, "send", deps, peer="next", nbytes=hidden_bytes, tag=f"F mb{mb} vs{vs + 1}",
                 microbatch=mb, units=tuple(units))
    return deps[0]


def _backward(prog, work, units, mb, vs, hidden_bytes, tp) -> int:
    last_unit = work.num_units - 1
    deps = [] if units[-1] == last_unit else [
        prog.add(Recv, "recv", peer="next", nbytes=hidden_bytes, tag=f"B mb{mb} vs{vs}", microbatch=mb,
                 units=tuple(units))]
    for unit in reversed(units):
        u = work.units[unit]
        if u.recompute_temp:
            prog.alloc("compute", "temporaries", u.recompute_temp, payload=f"recompute unit{unit} mb{mb}")
        halves = 2 if (tp > 1 and 0 < unit < last_unit) else 1
        for half in range(halves):  # MLP then attention (or the head), each ending in an input-gradient
            op = prog.add(Compute, "compute", deps, phase="bwd", unit=unit, microbatch=mb,  # all-reduce
                          flops=u.bwd_flops / halves, bytes=u.bwd_bytes / halves)
            deps = [op]
            if tp > 1 and unit > 0:
                deps = [_tp_allreduce(prog, work, hidden_bytes, deps, f"input grads unit{unit} mb{mb}")]
        if u.recompute_temp:
            prog.free("compute", "temporaries", u.recompute_temp, payload=f"recompute unit{unit} mb{mb}")
        if u.activations:
            prog.free("compute", "activations", u.activations, payload=f"unit{unit} mb{mb}")
    if vs > 0:
        prog.add(Send, "send", deps, peer="prev", nbytes=hidden_bytes, tag=f"B mb{mb} vs{vs - 1}",
                 microbatch=mb, units=tuple(units))
    return deps[0]


def _reduce_and_step(prog: Program, work: Work, scenario: Scenario, held: list[int], last: int) -> None:
    """ZeRO-1 across the DP group: reduce-scatter the stage's gradients, step the shard, gather."""
    spec = scenario.strategy
    reductions = [prog.add(Collective, "comm", [last], op="reducescatter", group="dp",
                           nbytes=work.w * work.params(bucket), algo=spec.algo or "ring", payload="grads",
                           itemsize=work.w,
                           units=bucket)
                  for bucket in buckets(work, list(reversed(held)), spec.bucket_bytes)]
    step = work.gpu_step(prog, work.params(held) // spec.dp, deps=reductions)
    for bucket in buckets(work, list(reversed(held)), spec.bucket_bytes):  # the shards' buckets
        prog.add(Collective, "comm", [step], op="allgather", group="dp", itemsize=work.w,
                 nbytes=work.w * work.params(bucket), algo=spec.algo or "ring", payload="params", units=bucket)
