"""How far apart two ranks leave a call, by the compute that follows it, and what the next call pays.

    python benchmarks/compute_after_call.py [--reps 150] [--lengths 0.2,0.5,1,2]

On 2 ranks (gloo, the executor's ring all-reduce of 16 KiB, spinners on as in every run), each rank loops
[call, compute of X ms] with X cycling over ``--lengths``, and takes the clock (one monotonic clock for the
machine) on entering and leaving every call. Per X, over the calls that X follows, it prints the mean and
median of: how far apart the ranks left the call before X (exit skew), how far apart they entered the one
after it (entry skew), that call from the later entry to the later exit, and its mean time per rank.

Why: in tp's step the backward's last call, which the optimizer follows (the step's longest compute without
a call), lets its ranks go 0.83 ms apart on average against 0.21 ms for the calls between pieces, and the next
step's first call cost 2.85 ms from the later entry against 1.72 ms for those (2026-11-30, 2 ranks, 37 steps).
On the development VM (03:3x, two launches of 150 reps) the exit skew's mean rose from 0.24-0.37 ms with 0.2 ms of
compute after the call to 0.82-1.10 ms with 2 ms, and the next call's mean from 2.06-2.40 ms to 3.48-3.75 ms,
where the calibration's curve rises 0.1 ms from 1 to 2 ms (docs/calibration.md, forty-fifth stop: "tp's step
boundary"). The next call's rise is a step, not a slope: a third launch read its median per rank 0.94 / 1.34 /
1.05 / 3.26 ms after 0.2 / 0.5 / 1 / 2 ms, and ``--lengths 0.8,1.2,1.6,2,3,4 --reps 80`` read 1.16 / 1.04 / 3.26 /
3.19 / 4.61 / 3.42 ms: between 1.2 and 1.6 ms of compute the call's median rose by 2.2 ms, near EEVDF's base slice
on 2 CPUs (0.75 ms x (1 + log2 2) = 1.5 ms; not read here, debugfs is not mounted). But with the lengths cycled
near it (``--lengths 1,1.2,1.4,1.5,1.6,1.8,2.5 --reps 150``, two launches) the median rose gradually, 1.66-1.77 /
1.94-2.09 / 2.53-2.81 / 2.43-2.54 / 2.45-2.72 / 2.91-3.06 / 2.97-3.18 ms: what a call costs follows the cycle's
mix (the pace of the calls before it: docs/calibration.md, "A call's wake follows the rank's pace") as well as the
compute right before it. Not priced yet: the calibration's curve (``calibrate/lag.py``) is a smooth fit from the
unit's 1.1-1.4 ms, and rises 0.1 ms from 1 to 2 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

WARMUP = 20


def compute_for(seconds: float) -> None:
    """Small matrix products for ``seconds`` (wall-clock) on this rank's core."""
    import torch

    a = torch.randn(64, 64)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = (a @ a).tanh_()


def worker(ctx, lengths: list[float], reps: int) -> list[tuple[float, float, float]]:
    """[(the compute after the call, entry, exit)] per timed call, on the machine's monotonic clock."""
    import torch
    import torch.distributed as dist

    from simpar.real.comm import CountingComm

    comm, group, flat = CountingComm(ctx.rank), list(range(ctx.world)), torch.zeros(4096)
    order = [x for _ in range(reps) for x in lengths]
    dist.barrier()
    for x in order[:WARMUP]:
        comm.ring_all_reduce(flat, group)
        compute_for(x)
    dist.barrier()
    marks = []
    for x in order:
        entry = time.perf_counter()
        comm.ring_all_reduce(flat, group)
        marks.append((x, entry, time.perf_counter()))
        compute_for(x)
    return marks


def by_compute_after(a: list, b: list) -> dict[float, dict[str, tuple[float, float]]]:
    """Two ranks' marks (the same calls in the same order) -> per length of the compute after a call: (mean,
    median) seconds of the exit skew of that call, the entry skew of the next, the next from the later entry to
    the later exit, and the next's mean time per rank."""
    rows: dict[float, list[tuple[float, float, float, float]]] = {}
    for i in range(1, len(a)):
        (x, _, a_out), (_, _, b_out) = a[i - 1], b[i - 1]
        (_, a0, a1), (_, b0, b1) = a[i], b[i]
        rows.setdefault(x, []).append((abs(a_out - b_out), abs(a0 - b0), max(a1, b1) - max(a0, b0),
                                       ((a1 - a0) + (b1 - b0)) / 2))
    names = ("exit skew", "next entry skew", "next from the later entry", "next per rank")
    return {x: {name: (statistics.fmean(column), statistics.median(column))
                for name, column in zip(names, zip(*values))} for x, values in sorted(rows.items())}


def main() -> None:
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=150)
    parser.add_argument("--lengths", default="0.2,0.5,1,2", help="ms of compute after each call, cycled")
    args = parser.parse_args()
    lengths = [float(ms) / 1e3 for ms in args.lengths.split(",")]
    a, b = launch(worker, 2, (lengths, args.reps), timeout=600)
    print("compute after (ms) | " + " | ".join(f"{name} mean / median (ms)" for name in
                                               next(iter(by_compute_after(a, b).values()))))
    for x, row in by_compute_after(a, b).items():
        print(f"{1e3 * x:18.1f} | " + " | ".join(f"{1e3 * m:.3f} / {1e3 * md:.3f}" for m, md in row.values()))


if __name__ == "__main__":
    main()
