"""What a call right after a short compute costs, repetition by repetition after a long compute.

    python benchmarks/short_calls.py [--seconds 30] [--bytes 262144] [--reps 60]

Every rank at once (2 ranks), round after round: three repetitions of 32 units of compute (the calibration's
unit, a tiny-deep layer's forward and backward) each followed by the executor's ring all-reduce, a barrier,
then ``--reps`` repetitions of a short compute (``SHORT_PHASE``: a tensor-parallel piece's) followed by one
all-reduce of ``--bytes``: tensor parallelism's pattern. Printed: the mean call by its repetition after the
barrier (each the ranks' mean), the calls back to back in the same round for comparison, and what the
calibration keeps (``SHORT_WARMUP`` on). A call that is dearer right after the long compute and settles within
some repetitions pays for time away from the calls (caches cold), as the once-a-step units do.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simpar.real.launch import launch


def short_worker(ctx, seconds: float, nbytes: int, reps: int) -> dict:
    """{"short": [[call seconds by repetition] per round], "back": [call seconds back to back, every round]}."""
    import torch
    import torch.distributed as dist

    from simpar.calibrate.bench import SHORT_PHASE, _short_burst, _unit_burst
    from simpar.real.comm import CountingComm

    comm, group = CountingComm(ctx.rank), list(range(ctx.world))
    unit, short = _unit_burst(), _short_burst(SHORT_PHASE)
    flat = torch.zeros(nbytes // 4)
    for _ in range(3):
        unit()
    comm.ring_all_reduce(flat, group)
    out: dict = {"short": [], "back": []}
    began, more = time.perf_counter(), torch.ones(1)
    while more.item():
        dist.barrier()
        for _ in range(3):
            for _ in range(32):
                unit()
            comm.ring_all_reduce(flat, group)
        dist.barrier()
        calls = []
        for _ in range(reps):
            short()
            start = time.perf_counter()
            comm.ring_all_reduce(flat, group)
            calls.append(time.perf_counter() - start)
        out["short"].append(calls)
        for _ in range(8):
            start = time.perf_counter()
            comm.ring_all_reduce(flat, group)
            out["back"].append(time.perf_counter() - start)
        more.fill_(float(time.perf_counter() - began < seconds))
        dist.broadcast(more, 0)
    return out


def main() -> None:
    from simpar.calibrate.bench import SHORT_WARMUP

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--bytes", type=int, default=2**18)
    parser.add_argument("--reps", type=int, default=60)
    args = parser.parse_args()
    if args.reps <= SHORT_WARMUP or args.seconds <= 0 or args.bytes < 8:
        parser.error(f"--reps must exceed the calibration's warm-up ({SHORT_WARMUP}), --seconds be positive and "
                     "--bytes at least 8")
    ranks = launch(short_worker, 2, (args.seconds, args.bytes, args.reps), timeout=600)
    rounds = list(zip(*(r["short"] for r in ranks)))  # per round, every rank's calls

    def mean(lo: int, hi: int) -> float:  # repetitions lo..hi-1: each round's mean over ranks, then the rounds'
        return statistics.fmean(statistics.fmean(calls[i] for calls in rnd for i in range(lo, hi)) for rnd in rounds)

    print(f"2 ranks, {args.bytes} B all-reduce after a short compute, {len(rounds)} rounds (ms per call):")
    for lo, hi in ((0, 1), (1, 2), (2, 3), (3, 5), (5, 10), (10, 20), (20, args.reps)):
        if hi <= args.reps:
            print(f"  repetitions {lo + 1:>2}-{hi:<2} after the long compute: {1e3 * mean(lo, hi):.2f}")
    print(f"  kept by the calibration ({SHORT_WARMUP + 1}-{args.reps}): {1e3 * mean(SHORT_WARMUP, args.reps):.2f}")
    back = statistics.fmean(t for r in ranks for t in r["back"])
    print(f"  back to back, the same rounds: {1e3 * back:.2f}")


if __name__ == "__main__":
    main()
