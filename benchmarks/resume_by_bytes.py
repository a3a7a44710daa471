"""How much slower the calibration's unit bursts run after a ring all-reduce of each size than after no call.

    python benchmarks/resume_by_bytes.py [--gpus 2] [--runs 2] [--rounds 15] [--bursts 6]

Every rank computes ``--bursts`` of the calibration's unit bursts (a tiny-deep layer's forward and backward at
micro-batch 2: ``_unit_burst``), each timed, right after one of the executor's ring all-reduces of 4 KiB,
256 KiB or 2 MiB, or after no call at all; the sizes in turn, six repetitions each a round. Per run it prints
the bursts' mean time after no call and, per size, each burst's mean excess over it by its place. Nothing is
fitted: the profile's ``resume`` is one value over the calibration's bursts after every size (docs/calibration.md,
the thirty-eighth stop: at 2 ranks the first burst after 2 MiB paid +259 to +340 us, after 4 KiB +73 to +104).
"""

from __future__ import annotations

import argparse
import statistics
import time

from simpar.calibrate import PATTERN_SIZES

SIZES = (0, *PATTERN_SIZES)  # bytes of the call before the bursts (the calibration's pattern's); 0: none
REPETITIONS = 6  # of each size a round


def worker(ctx, rounds: int, bursts: int) -> dict:
    import torch

    from simpar.calibrate.bench import _unit_burst
    from simpar.real.comm import CountingComm

    comm, group = CountingComm(ctx.rank), list(range(ctx.world))
    unit = _unit_burst()
    flats = {size: torch.zeros(max(size // 4, ctx.world)) for size in SIZES}
    for _ in range(5):  # a fresh process's first backwards take tens of milliseconds
        unit()
    times: dict[int, list[list[float]]] = {size: [[] for _ in range(bursts)] for size in SIZES}
    for _ in range(rounds):
        for size in SIZES:
            for _ in range(REPETITIONS):
                if size:  # no call at all before the baseline's bursts (a barrier is a call too)
                    comm.ring_all_reduce(flats[size], group)
                for place in range(bursts):
                    began = time.perf_counter()
                    unit()
                    times[size][place].append(time.perf_counter() - began)
    return {size: [statistics.fmean(at) for at in places] for size, places in times.items()}


def main() -> None:
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--bursts", type=int, default=6)
    args = parser.parse_args()
    for run in range(args.runs):
        ranks = launch(worker, args.gpus, (args.rounds, args.bursts), timeout=600)
        base = [statistics.fmean(rank[0][place] for rank in ranks) for place in range(args.bursts)]
        print(f"run {run + 1}, {args.gpus} ranks: a burst after no call {1e3 * statistics.fmean(base):.3f} ms")
        for size in SIZES[1:]:
            excess = [statistics.fmean(rank[size][place] for rank in ranks) - base[place] for place in range(args.bursts)]
            print(f"  after {size:>8} B: " + " ".join(f"{1e6 * e:+5.0f}" for e in excess)
                  + f" us by place, {1e6 * sum(excess):+.0f} in all", flush=True)


if __name__ == "__main__":
    main()
