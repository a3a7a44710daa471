"""A series of calls after computing, call by call: how a call's cost depends on its place in the series.

    python benchmarks/series_positions.py [--seconds 40] [--ranks 2] [--calls 10]

Every rank computes (calibration's unit, ``_unit_burst``, or a short compute of 0.6 ms, about a
tiny-deep layer's forward: ZeRO-3's computes between its series), then makes ``--calls`` of the
executor's ring all-gathers in a row (4 KiB; and ZeRO-3's mix of a layer's module sizes after the
unit), repeated, the variants interleaved ten repetitions at a time for ``--seconds``. Prints each
position's mean time (every rank, every repetition), the mean of the second to fourth and of the
fifth to last but one, and the last (a compute follows it).

Why: ``simpar calibrate`` fits the step latency on rows of 1 and 4 calls after the unit, and ZeRO-3
gathers a layer's modules in series of 8-10 calls. On the development VM (2 ranks, 2026-11-26) the
later calls took 0.22-0.49 ms less than the second to fourth after the unit, about half that after
the short compute; the executor's own ZeRO-3 step, op by op, showed a drop of 0.1-0.2 ms by position
(docs/calibration.md, "Calls later in a series"). Nothing here is priced.
"""

from __future__ import annotations

import argparse
import statistics
import time

SIZES_ZERO3 = (512, 512, 16640, 16640, 16640, 16640, 66560, 65792, 512, 512)  # tiny-deep's modules, bytes


def worker(ctx, seconds: float, calls: int) -> dict:
    import torch
    import torch.distributed as dist

    from simpar.calibrate.bench import _short_burst, _unit_burst
    from simpar.calibrate.series import timed_series
    from simpar.real.comm import CountingComm

    comm, group, n = CountingComm(ctx.rank), list(range(ctx.world)), ctx.world

    def gather(nbytes: int):
        numel = max(nbytes // 4, n)
        mine = torch.tensor_split(torch.zeros(numel), n)[ctx.rank]
        return lambda: comm.ring_all_gather(mine, numel, group)

    unit, short = _unit_burst(), _short_burst(6e-4)
    small = [gather(4096)] * calls
    mixed = [gather(SIZES_ZERO3[i % len(SIZES_ZERO3)]) for i in range(calls)]
    variants = {"unit, 4 KiB": (unit, small), "0.6 ms, 4 KiB": (short, small), "unit, ZeRO-3 mix": (unit, mixed)}
    for _ in range(3):  # warm up (a fresh process's first backward is slow) and connect
        unit()
    small[0]()
    marks: dict[str, list[list[float]]] = {key: [] for key in variants}
    began, more = time.perf_counter(), torch.ones(1)
    while more.item():  # the variants interleaved, ten repetitions of each at a time; rank 0 says when to stop
        for key, (compute, series) in variants.items():
            marks[key] += timed_series(compute, series, 0.0)
        more.fill_(float(time.perf_counter() - began < seconds))
        dist.broadcast(more, 0)
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=10, help="calls in a series (at least 6)")
    args = parser.parse_args()
    if args.calls < 6:
        parser.error("--calls: at least 6 (the second to fourth, the fifth on, and the last)")
    from simpar.calibrate.series import series_positions
    from simpar.real.launch import launch

    ranks = launch(worker, args.ranks, (args.seconds, args.calls), timeout=args.seconds * 4 + 300)
    print(f"{args.ranks} ranks, {args.calls} ring all-gathers in a row after computing; mean ms by position")
    for key in ranks[0]:
        means = [1e3 * t for t in series_positions([r[key] for r in ranks])]
        print(f"  {key:<18} {' '.join(f'{m:.3f}' for m in means)}   | 2nd-4th {statistics.fmean(means[1:4]):.3f}"
              f"   5th to last but one {statistics.fmean(means[4:-1]):.3f}   last {means[-1]:.3f}"
              f"   ({len(ranks[0][key])} series)")


if __name__ == "__main__":
    main()
