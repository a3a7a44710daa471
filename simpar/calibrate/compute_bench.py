"""The units' compute as the executor performs it, on one rank, each model and micro-batch timed in visits
taken in turns (a machine's speed drifts: visited in turns, the rows share the pass's mixture of states)."""

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
    """Rows of each unit kind's forward and backward seconds (with the FLOPs the simulator prices), the step op
    (``step_s``), and the handling of the data (``reduce_s``: the one-rank all-reduce op; ``gather_s``,
    ``scatter_s``, ``accumulate_s``: handling.py), timed in the executor's own step on one rank under DDP:
    a unit benchmarked apart would miss what the executor does around each op. At least ``repeats`` timed
    steps of each model and batch."""
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
