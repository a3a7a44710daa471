"""Each ring step of a call after a compute: an all-reduce's two steps against an all-gather's one, at 2 ranks.

    python benchmarks/call_steps.py [--rounds 100] [--units 1,8] [--bytes 262144] [--runs 1]

Every rank computes the calibration's unit (``_unit_burst``: tiny-deep's layer, forward and backward) N times,
then makes one call with the executor's ring (``CountingComm``): an all-reduce of ``--bytes`` (two steps at 2
ranks, each of half the bytes) or an all-gather of the same step bytes (one step); four repetitions a kind after a
barrier, the kinds and lengths in turn, ``--rounds`` times. Per kind and length it prints the mean and median of
the first step (the wait for the other rank included) and of the all-reduce's second, both ranks' mean, and how
many second steps took over 2 ms. Nothing is priced or fitted. On the fortieth stop (2026-11-29, six runs) the
all-reduce's second step took 1.03-1.66 ms on average after 1 unit and 1.76-2.67 ms after 8, more than its first
step in every run (0.67-1.23 and 1.28-1.79 ms, the wait for the other rank included), 14-30 % and 33-53 % of them
over 2 ms; the all-gather's lone step 0.86-1.63 and 1.45-2.16 ms: a call's later steps stall more than its first,
and more after a longer compute (``later_steps``, calibrate/lag.py; docs/calibration.md).
"""

from __future__ import annotations

import argparse
import statistics
import time


def worker(ctx, rounds: int, units: list[int], nbytes: int) -> dict:
    """{"allreduce N" / "allgather N": [[call start, each step's end], ...]} on the machine's one clock."""
    import torch
    import torch.distributed as dist

    from simpar.calibrate.bench import _unit_burst
    from simpar.real.comm import CountingComm

    class StepClock(CountingComm):
        """The executor's ring, each step's end noted (``ends``, cleared before each call)."""

        def _exchange(self, *args) -> None:
            super()._exchange(*args)
            self.ends.append(time.perf_counter())

    comm, group, unit = StepClock(ctx.rank), list(range(ctx.world)), _unit_burst()
    comm.ends = []
    flat, mine = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4 // ctx.world)
    calls = {"allreduce": lambda: comm.ring_all_reduce(flat, group),
             "allgather": lambda: comm.ring_all_gather(mine, nbytes // 4, group)}
    for _ in range(3):  # a fresh process's first backwards take tens of milliseconds
        unit()
    for call in calls.values():  # and the connections
        call()
    marks: dict[str, list[list[float]]] = {f"{kind} {n}": [] for n in units for kind in calls}
    for _ in range(rounds):
        for n in units:
            for kind, call in calls.items():
                dist.barrier()
                for _ in range(4):
                    for _ in range(n):
                        unit()
                    comm.ends = []
                    start = time.perf_counter()
                    call()
                    marks[f"{kind} {n}"].append([start, *comm.ends])
    return marks


def step_times(ranks: list[dict], key: str, step: int) -> list[float]:
    """Each repetition's ``step``-th step (0: the first, timed from the call's start), averaged over the ranks."""
    return [statistics.fmean(r[step + 1] - r[step] for r in reps) for reps in zip(*(rank[key] for rank in ranks))]


def main() -> None:
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--units", default="1,8", help="the computes before the calls, in units (comma-separated)")
    parser.add_argument("--bytes", type=int, default=2**18, help="the all-reduce's bytes (the all-gather's result)")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    units = [int(n) for n in args.units.split(",")]

    def cell(seconds: list[float]) -> str:
        return f"{1e3 * statistics.fmean(seconds):5.2f} / {1e3 * statistics.median(seconds):5.2f}"

    for run in range(args.runs):
        ranks = launch(worker, 2, (args.rounds, units, args.bytes), timeout=600)
        print(f"run {run + 1} (ms, mean / median of both ranks' mean)")
        for key in ranks[0]:
            line = f"  {key:<13} first step {cell(step_times(ranks, key, 0))}"
            if key.startswith("allreduce"):
                second = step_times(ranks, key, 1)
                stalled = sum(s > 2e-3 for s in second)
                line += f"   second step {cell(second)}   over 2 ms {stalled}/{len(second)}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
