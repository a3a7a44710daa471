"""The executor's computes with its data-parallel calls as they are, swapped for a 4-byte all-reduce, or left out.

    python benchmarks/call_swap.py [--strategy ddp] [--gpus 2] [--rounds 3] [--steps 200]

Runs validate's case of ``--strategy`` (tiny-deep, fp32) on one rank, then on ``--gpus`` ranks three ways, in
turn, ``--rounds`` times: every collective as the Plan has it ("real"), each swapped for one ring all-reduce of
4 bytes ("tiny": the ranks still meet and wait for each other, nothing moves), and each left out ("none": the
ranks run free). Per run it prints the step and every rank's mean per compute kind (phase and unit kind). Nothing
is priced or fitted; the gradients of the swapped runs are not averaged, which changes no op's work. On the
thirty-ninth stop (2026-11-29 08:38, DDP at 2 ranks, three rounds) the forward layers took 372-403 / 393-406 /
356-368 us against 365-388 on one rank: the call slows the computes after it, not its bytes, nor the ranks
computing side by side (``resume_tail``, calibrate/tail.py; docs/calibration.md).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

MODES = ("real", "tiny", "none")


def worker(ctx, scenario, steps: int, mode: str) -> dict:
    """One rank's run with its collectives done as ``mode`` says (the executor's class patched in this rank's
    process only); its mean seconds per op and step."""
    import torch

    from simpar.real import executor

    collective, tiny = executor.RankExecutor._collective, torch.zeros(2)

    def swapped(self, op):
        if mode == "real":
            return collective(self, op)
        if mode == "tiny":
            self.comm.ring_all_reduce(tiny, list(range(ctx.world)))
        return None

    executor.RankExecutor._collective = swapped
    out = executor.run_rank(ctx, scenario, steps, 0)
    return {"rank": ctx.rank, "op_means": out["op_means"], "step": statistics.fmean(out["step_times"][1:])}


def main() -> None:
    from simpar.plan import Compute
    from simpar.real.launch import launch
    from simpar.strategies import build_plan
    from simpar.validate import case_scenario

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for world, mode in ((1, "real"), *((args.gpus, m) for m in MODES)):
            scenario = case_scenario(args.strategy, world, "fp32")
            plan = build_plan(scenario)
            ranks = launch(worker, world, (scenario, args.steps, mode), timeout=600)
            kinds: dict[str, list[float]] = defaultdict(list)
            for rank in ranks:
                ops = {op.id: op for op in plan.program_of(rank["rank"]).ops}
                for op_id, seconds in rank["op_means"].items():
                    op = ops[int(op_id)]
                    if isinstance(op, Compute):
                        kinds[f"{op.phase} {scenario.model.unit_kind(op.unit)}"].append(seconds)
            means = "  ".join(f"{kind} {1e6 * statistics.fmean(s):5.0f}" for kind, s in sorted(kinds.items()))
            step = 1e3 * statistics.fmean(r["step"] for r in ranks)
            print(f"{world} rank(s), {mode:<4}: step {step:6.2f} ms | us: {means}", flush=True)


if __name__ == "__main__":
    main()
