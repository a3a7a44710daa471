"""Do ranks computing at once slow each other, or only wait for each other? The 2-rank compute slowdown.

    python benchmarks/own_pace.py [--gpus 2] [--seconds 12] [--units 16] [--runs 2]

Runs calibration's unit (``_unit_burst``: a tiny-deep layer's forward and backward at micro-batch 2) in
rounds on ``--gpus`` ranks, each round: every rank alone in turn (the others waiting in a barrier), then all
at once, ``--units`` units each, for ``--seconds``. Prints each core's time per unit alone, each rank's own
time together (from the barrier to its own end), the slower rank's, and barrier to barrier, with the
median ratios per round. On the 2-core development VM (2026-11-27, 17:0x) each rank's own time together was
0.99-1.00x its time alone and barrier to barrier 1.06-1.23x: the ranks do not slow each other; the calibrated
slowdown is a rank's own pace (``burst_worker``'s ``own_ratio``), and the lead of the slowest rank is what
the calls after a compute pay (docs/calibration.md, "Each rank's own pace").
"""

from __future__ import annotations

import argparse
import statistics
import time


def rounds(ctx, seconds: float, units: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from simpar.calibrate.bench import _unit_burst

    unit = _unit_burst()
    for _ in range(20):  # warm
        unit()
    rows, began, more = [], time.perf_counter(), torch.ones(1)
    while more.item():
        row = {}
        for who in range(ctx.world):
            dist.barrier()
            start = time.perf_counter()
            if ctx.rank == who:
                for _ in range(units):
                    unit()
            row[f"alone{who}"] = (time.perf_counter() - start) / units
        dist.barrier()
        start = time.perf_counter()
        for _ in range(units):
            unit()
        row["own"] = (time.perf_counter() - start) / units
        dist.barrier()
        row["all"] = (time.perf_counter() - start) / units
        rows.append(row)
        more.fill_(float(time.perf_counter() - began < seconds))
        dist.broadcast(more, 0)
    return rows


def summary(ranks: list[list[dict]]) -> dict:
    """Per round, over ``ranks``' rows (each rank's list, round by round): means over the rounds of each
    core alone, each rank's own time together (averaged over ranks), the slower rank's, barrier to barrier;
    medians over the rounds of own / alone (each rank against its own core alone) and all / own."""
    world, per_round = len(ranks), list(zip(*ranks))
    alone = [statistics.fmean(r[rank][f"alone{rank}"] for rank in range(world)) for r in per_round]
    own = [statistics.fmean(r[rank]["own"] for rank in range(world)) for r in per_round]
    slowest = [max(r[rank]["own"] for rank in range(world)) for r in per_round]
    every = [r[0]["all"] for r in per_round]
    return {"rounds": len(per_round), "alone": statistics.fmean(alone), "own": statistics.fmean(own),
            "slowest": statistics.fmean(slowest), "all": statistics.fmean(every),
            "own_over_alone": statistics.median(o / a for o, a in zip(own, alone)),
            "all_over_own": statistics.median(e / o for e, o in zip(every, own))}


def main() -> None:
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--units", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for run in range(args.runs):
        s = summary(launch(rounds, args.gpus, (args.seconds, args.units), timeout=args.seconds * 10 + 120))
        print(f"run {run + 1}: {s['rounds']} rounds; per unit: alone {1e3 * s['alone']:.3f} ms, own together "
              f"{1e3 * s['own']:.3f}, the slower rank {1e3 * s['slowest']:.3f}, barrier to barrier "
              f"{1e3 * s['all']:.3f}; own / alone {s['own_over_alone']:.3f}, barrier to barrier / own "
              f"{s['all_over_own']:.3f}")


if __name__ == "__main__":
    main()
