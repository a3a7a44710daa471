"""DDP: every rank holds the whole model; gradients are all-reduced in buckets while backward
still runs (PyTorch DistributedDataParallel).

A bucket is all-reduced as soon as backward has produced all of its gradients, so its
communication hides behind the backward of earlier layers. With gradient accumulation, only
the last micro-batch communicates (``no_sync`` on the others).
"""

from __future__ import annotations

from simpar.plan import Grid, Plan, Program
from simpar.scenario import Scenario
from simpar.strategies.experts import grad_calls
from simpar.strategies.work import Work, buckets


def build(scenario: Scenario, algo: str | None = None, bucket_bytes: int | None = None,
          name: str = "ddp") -> Plan:
    spec = scenario.strategy
    algo = algo or spec.algo or "ring"
    work = Work(scenario)
    prog = Program(tuple(range(spec.dp)), name="all ranks")
    phi = work.params(range(work.num_units))
    work.static(prog, work.w * phi, work.g * phi, work.k * phi)
    backward_order = list(reversed(range(work.num_units)))
    groups = buckets(work, backward_order, bucket_bytes if bucket_bytes is not None else spec.bucket_bytes)
    closes = {bucket[-1]: bucket for bucket in groups}
    reductions = []
    m = scenario.microbatches
    for mb in range(m):
        for unit in range(work.num_units):
            work.forward(prog, unit, mb)
        for unit in backward_order:
            done = work.backward(prog, unit, mb)
            if mb == m - 1 and unit in closes:
                bucket = closes[unit]
                reductions += grad_calls(prog, work, "allreduce", bucket, [done], algo)
    work.gpu_step(prog, phi, deps=reductions)
    return Plan(name, Grid(dp=spec.dp, ep=spec.ep), [prog])
