"""ZeRO stages 1 and 2 (Rajbhandari et al. 2020): optimizer states (and, in stage 2, gradients)
split across the data-parallel group.

Backward reduce-scatters gradient buckets as they fill, so each rank receives the sum of only
its shard; each rank updates its shard of the parameters, then an all-gather gives every rank
the whole updated model. Stage 1 keeps full gradients (it reduces once, at the last
micro-batch); stage 2 keeps only its gradient shard, so it must reduce every micro-batch and
holds a full gradient only while its bucket is in flight (a communication buffer).
"""

from __future__ import annotations

from simpar.plan import Grid, Plan, Program
from simpar.scenario import Scenario
from simpar.strategies.experts import grad_calls
from simpar.strategies.work import Work, buckets


def build(scenario: Scenario) -> Plan:
    spec = scenario.strategy
    stage = 2 if spec.name == "zero2" else 1
    work = Work(scenario)
    n = spec.dp
    prog = Program(tuple(range(n)), name="all ranks")
    phi = work.params(range(work.num_units))
    everything = range(work.num_units)
    shard = work.shard(everything, n)
    work.static(prog, work.w * phi, work.g * (shard if stage == 2 else phi), work.k * shard)
    last_reductions = reduce_gradients(prog, work, scenario, sharded_grads=stage == 2)
    step = work.gpu_step(prog, int(shard), deps=last_reductions)
    gather_parameters(prog, work, spec, step)
    return Plan(spec.name, Grid(dp=n, ep=spec.ep), [prog])


def reduce_gradients(prog: Program, work: Work, scenario: Scenario, sharded_grads: bool,
                     after_reduce=None) -> list[int]:
    """Forward and backward of every micro-batch, reduce-scattering gradient buckets as they
    fill (every micro-batch when gradients are sharded, else only the last). ``after_reduce(prog,
    work, op, bucket, mb)`` may add ops behind each reduction (offload copies); returns the last ops."""
    spec = scenario.strategy
    backward_order = list(reversed(range(work.num_units)))
    closes = {bucket[-1]: bucket for bucket in buckets(work, backward_order, spec.bucket_bytes)}
    m = scenario.microbatches
    last = []
    for mb in range(m):
        reduce_now = sharded_grads or mb == m - 1
        for unit in range(work.num_units):
            work.forward(prog, unit, mb)
        for unit in backward_order:
            if sharded_grads:  # the full gradient of this unit lives in a bucket buffer until reduced
                prog.alloc("compute", "buffers", work.w * work.units[unit].params, payload=f"grad unit{unit}")
            done = work.backward(prog, unit, mb)
            if reduce_now and unit in closes:
                bucket = closes[unit]
                nbytes = work.w * work.params(bucket)
                # DeepSpeed's ZeRO-1/2 all-reduce each bucket (stage_1_and_2.py average_tensor -> allreduce_and_copy),
                # then keep their partition: twice a reduce-scatter's bytes
                reduce = "allreduce" if spec.deepspeed_habits else "reducescatter"
                calls = grad_calls(prog, work, reduce, bucket, [done], spec.algo or "ring")
                if sharded_grads:
                    prog.free("comm", "buffers", nbytes, payload=f"grads of units {bucket[0]}..{bucket[-1]}")
                last += [after_reduce(prog, work, op, bucket, mb) if after_reduce else op for op in calls]
        if reduce_now and mb < m - 1:
            last = []
    return last


def gather_parameters(prog: Program, work: Work, spec, after: int) -> None:
    """All-gather the updated parameter shards once the step is done, in the same buckets the
    gradients were reduce-scattered in (a rank's optimizer shard is its chunk of each bucket)."""
    for bucket in buckets(work, list(reversed(range(work.num_units))), spec.bucket_bytes):
        grad_calls(prog, work, "allgather", bucket, [after], spec.algo or "ring", payload="params")
