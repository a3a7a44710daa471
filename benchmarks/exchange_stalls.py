"""Each ring exchange of the executor's data-parallel calls, by its place in its call: median, mean and stalls.

    python benchmarks/exchange_stalls.py [--strategies ddp,zero1] [--gpus 2] [--runs 2] [--steps 250]

Runs validate's case of each strategy (tiny-deep, fp32) ``--runs`` times, the strategies in turn, and times
every ``CountingComm._exchange`` (one ring step: the isend, the blocking receive, the send's wait) and every
data-parallel call inside the executor's own step, the first ten of each left out. Per strategy and run it
prints, for each call kind and each exchange by its place in its call (DDP's all-reduce: the reduce-scatter's
exchange, then the all-gather's; ZeRO-1: one a call), the median, the mean, the share over 2 ms and the mean of
those. Nothing is priced or fitted: it shows where a call's mean leaves its median (docs/calibration.md, the
thirty-eighth stop: at 2 ranks DDP's exchanges of 0.87 MB took 0.5-3.2 ms by the median and 1.6-3.0 ms on
average, 15-60 % of them stalling for 4.5-5 ms, the share drawn run by run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

STALL = 2e-3  # seconds: an exchange over this stalled (the medians are about 1 ms)
SKIPPED = 10  # the first calls and exchanges of each kind: the run's warm-up


def worker(ctx, scenario, steps: int) -> dict:
    """One rank's run with its exchanges and data-parallel calls timed (the executor's classes patched in
    this rank's process only)."""
    from simpar.real import comm, executor

    times: dict[str, list[float]] = defaultdict(list)
    place = [0]
    exchange, collective = comm.CountingComm._exchange, executor.RankExecutor._collective

    def timed_exchange(self, *args):
        began = time.perf_counter()
        try:
            return exchange(self, *args)
        finally:
            times[f"exchange {place[0]}"].append(time.perf_counter() - began)
            place[0] += 1

    def timed_collective(self, op):
        place[0] = 0
        began = time.perf_counter()
        try:
            return collective(self, op)
        finally:
            times[f"call {op.op}"].append(time.perf_counter() - began)

    comm.CountingComm._exchange, executor.RankExecutor._collective = timed_exchange, timed_collective
    executor.run_rank(ctx, scenario, steps, 0)
    return {kind: seconds[SKIPPED:] for kind, seconds in times.items()}


def summary(seconds: list[float]) -> str:
    stalled = [s for s in seconds if s > STALL]
    return (f"median {1e3 * statistics.median(seconds):5.2f}  mean {1e3 * statistics.fmean(seconds):5.2f} ms  "
            f"over 2 ms {100 * len(stalled) / len(seconds):3.0f} %" +
            (f" (mean {1e3 * statistics.fmean(stalled):.1f} ms)" if stalled else ""))


def main() -> None:
    from simpar.real.launch import launch
    from simpar.validate import case_scenario

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="ddp,zero1")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=250)
    args = parser.parse_args()
    for run in range(args.runs):
        for strategy in args.strategies.split(","):
            ranks = launch(worker, args.gpus, (case_scenario(strategy, args.gpus, "fp32"), args.steps), timeout=600)
            print(f"run {run + 1}, {strategy} on {args.gpus} ranks (every rank's, pooled):")
            for kind in sorted(ranks[0]):
                print(f"  {kind:<22} {summary([s for rank in ranks for s in rank[kind]])}", flush=True)


if __name__ == "__main__":
    main()
