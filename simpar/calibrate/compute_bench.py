"""The units' compute as the executor performs it, on one rank (``compute_worker``), each model and
micro-batch timed in visits taken in turns.

Why in visits: a shared VM's cores can flip between a fast and a slow state for seconds at a time. Timed
config after config, each model and batch would draw its own states; visited in turns, every row is timed
across the whole pass and the rows share its mixture of states.
"""

from __future__ import annotations

import statistics

from simpar.calibrate.handling import time_accumulate, time_gather, time_scatter
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.strategies.work import Work

TIMED_PER_VISIT = 2  # timed steps a visit, each visit after one warm-up step (caches refilled)


class _Config:
    """One model and micro-batch: the executor and what its timed steps have recorded so far."""

    def __init__(self, ctx, name: str, batch: int, precision: str):
        from simpar.real.executor import RankExecutor

        self.name, self.batch, self.spec = name, batch, model(name)
        scenario = make_scenario(self.spec, "ddp", 1, micro_batch=batch, precision=precision, topology="cpu-host")
        self.executor = RankExecutor(ctx, scenario, seed=ctx.rank)
        self.ops, self.work = self.executor.program.ops, Work(scenario)
        self.steps = 0
        self.seconds: dict[tuple[str, str], list[float]] = {}
        self.stepped: list[float] = []  # the optimizer step op, as the step meets it (its caches cold)
        self.handled: list[float] = []  # the gradients' all-reduce op: on one rank, flattening and re-pointing
        self.gathered: list[float] = []  # ZeRO-1/2's all-gather: the parameters copied out of a buffer
        self.scattered: list[float] = []  # ZeRO-2's reduce-scatter: the gradients concatenated, then dropped
        self.accumulated: list[float] = []  # a later micro-batch's gradients added into the held ones

    def step(self, timed: bool) -> None:
        executor, ops, spec = self.executor, self.ops, self.spec
        executor.step(self.steps)
        self.steps += 1
        if not timed:
            return
        self.gathered.append(time_gather(executor.states))  # where ZeRO's comes: after the step
        self.scattered.append(time_scatter(executor.states))
        self.accumulated.append(time_accumulate(executor.states))
        for entry in executor.recorder.timeline:
            op = ops[entry["op"]]
            if getattr(op, "phase", None) in ("fwd", "bwd"):
                self.seconds.setdefault((spec.unit_kind(op.unit), op.phase), []).append(entry["end"] - entry["start"])
            elif getattr(op, "phase", None) == "step":
                self.stepped.append(entry["end"] - entry["start"])
            elif getattr(op, "payload", None) == "grads":  # one rank: the data's handling alone
                self.handled.append(entry["end"] - entry["start"])

    def rows(self) -> list[dict]:
        spec, work = self.spec, self.work
        rows = []
        for kind, unit in (("embedding", 0), ("layer", 1), ("head", work.num_units - 1)):
            u = work.units[unit]
            rows.append({"model": self.name, "batch": self.batch, "unit": kind, "fwd_flops": u.fwd_flops,
                         "bwd_flops": u.bwd_flops, "scores": spec.attention_scores(self.batch) if kind == "layer" else 0,
                         "fwd_s": statistics.fmean(self.seconds[(kind, "fwd")]),
                         "bwd_s": statistics.fmean(self.seconds[(kind, "bwd")]),
                         "params": spec.params, "step_s": statistics.fmean(self.stepped),
                         "reduce_s": statistics.fmean(self.handled),
                         "gather_s": statistics.fmean(self.gathered), "scatter_s": statistics.fmean(self.scattered),
                         "accumulate_s": statistics.fmean(self.accumulated),
                         "tensors": sum(spec.unit_tensors(spec.unit_kind(u)) for u in range(work.num_units)),
                         "timed_steps": len(self.stepped)})
        return rows


def compute_worker(ctx, models: list[str], batches: list[int], precision: str, repeats: int) -> list[dict]:
    """Forward and backward time of each kind of unit, with the FLOPs the simulator prices it at, as
    the executor itself performs them: its own step (RankExecutor) on one rank under DDP, so nothing
    is communicated, each unit's ops timed by its recorder; at least ``repeats`` timed steps of each
    model and batch, in visits taken in turns (``TIMED_PER_VISIT`` timed steps after one warm-up step;
    two on the first visit, whose first samples memory). A unit benchmarked apart from the executor
    misses what the executor does around each op (slicing the batch, keeping inputs for backward, the
    loss; 0.1 ms per op on the development VM) and splits forward and backward differently. The
    optimizer's step op (Adam over the whole model: ``step_s`` for ``params``) is timed here too, for
    the same reason: after the backward has filled the caches with other data, and with the executor's
    gradient flattening around it, it took 1.0 ms for tiny's 119 K parameters where Adam stepping the
    same tensor again and again (``host_worker``) took 0.33 ms. So is its
    gradients' all-reduce op, which on one rank communicates nothing: ``reduce_s`` is the executor's
    own handling of the data around any data-parallel collective (``tensors`` parameter tensors
    concatenated into one buffer, scaled, and each gradient re-pointed into it); ``gather_s`` what
    ZeRO-1/2's all-gather does instead and ``scatter_s`` what ZeRO-2's reduce-scatter does, timed right
    after each step (``handling``), as is ``accumulate_s``, what a later micro-batch's backward pays to add
    its gradients into the held ones; ``timed_steps`` how many steps were timed."""
    configs = [_Config(ctx, name, b, precision) for name in models for b in batches]
    try:
        for visit in range(-(-repeats // TIMED_PER_VISIT)):
            for config in configs:
                for _ in range(2 if visit == 0 else 1):
                    config.step(timed=False)
                for _ in range(TIMED_PER_VISIT):
                    config.step(timed=True)
    finally:
        for config in configs:
            config.executor.states.close()
    return [row for config in configs for row in config.rows()]
