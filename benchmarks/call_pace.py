"""Does a call's cost follow the compute right before it, or the rank's pace over many calls?

    python benchmarks/call_pace.py [--launches 3] [--rounds 10] [--reps 64] [--block 16]

Every rank at once (2 ranks), loops of a compute then the executor's ring all-reduce of the calibration's short
size (``SHORT_SIZE``), interleaved round by round: the unit's forward once at micro-batch 1 alone (short, the
calibration's "brief" loop), twice at micro-batch 2 alone (long, 2.2x), the two alternated call by call, and
the two in blocks of ``--block`` calls each (tensor parallelism's forward and backward pieces come in blocks
of 16). Printed per launch: each loop's mean compute and mean call, the mixed loops' split by the compute each
call follows. If the calls of a mixed loop cost alike after either compute, and between the pure loops', a
call's wake is set by the rank's pace, and the simulator reads it at the mean compute of a program's calls
(``OpCosts._paces``); if each costs as in its pure loop, by the compute before it.

On the 2-core development VM (2026-11-29, 20:1x-20:2x): eight launches of the alternated loop read 1.23/1.24,
1.26/1.30, 1.29/1.20, 1.10/1.31, 1.34/1.48, 1.52/1.54, 1.42/1.63 and 1.23/1.33 ms after the short/long compute
(0.10 ms cheaper to 0.21 dearer after the long, mean 0.08) where the pure loops read 1.08-1.36 and 1.27-1.73 ms
(0.08-0.47 apart, mean 0.33); in blocks of 16 the calls kept 0.07-0.45 ms apart, so the pace runs over a few
calls (docs/calibration.md, "A call's wake follows the rank's pace").
"""

from __future__ import annotations

import argparse
import statistics
import time

from simpar.real.launch import launch

SHORT, LONG = (1, 1), (2, 2)  # (forwards, micro-batch) of the short and the long compute


def pace_worker(ctx, rounds: int, reps: int, block: int) -> dict:
    """{loop: [(compute kind, compute seconds, call seconds)]} for the loops "short", "long", "alternated"
    and "blocks"."""
    import torch

    from simpar.calibrate.bench import _unit_burst
    from simpar.calibrate.profile import SHORT_SIZE
    from simpar.real.comm import CountingComm

    comm, group = CountingComm(ctx.rank), list(range(ctx.world))
    flat = torch.zeros(SHORT_SIZE // 4)
    forwards = {batch: _unit_burst(backward=False, batch=batch) for batch in (SHORT[1], LONG[1])}
    computes = {"short": SHORT, "long": LONG}
    kinds = {"short": lambda i: "short", "long": lambda i: "long",
             "alternated": lambda i: ("short", "long")[i % 2],
             "blocks": lambda i: ("short", "long")[(i // block) % 2]}
    def compute(name: str) -> None:
        times, batch = computes[name]
        for _ in range(times):
            forwards[batch]()

    for i in range(20):  # warm up
        for kind in kinds.values():
            compute(kind(i))
            comm.ring_all_reduce(flat, group)
    out: dict = {loop: [] for loop in kinds}
    for _ in range(rounds):
        for loop, kind in kinds.items():
            for i in range(reps):
                name = kind(i)
                start = time.perf_counter()
                compute(name)
                called = time.perf_counter()
                comm.ring_all_reduce(flat, group)
                out[loop].append((name, called - start, time.perf_counter() - called))
    return out


def summary(results: list[dict]) -> list[str]:
    """Per loop (and per compute within a mixed loop): mean compute and mean call over every rank, ms."""
    lines = []
    for loop in results[0]:
        rows = [row for rank in results for row in rank[loop]]
        split = [None] if loop in ("short", "long") else [None, "short", "long"]
        for name in split:
            kept = [row for row in rows if name is None or row[0] == name]
            label = loop if name is None else f"  {loop}, after the {name}"
            lines.append(f"{label:28s} compute {1e3 * statistics.fmean(r[1] for r in kept):.3f} ms   "
                         f"call {1e3 * statistics.fmean(r[2] for r in kept):.3f} ms   ({len(kept)} calls)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--reps", type=int, default=64, help="calls per loop a round")
    parser.add_argument("--block", type=int, default=16, help="calls after each compute in a row (blocks)")
    args = parser.parse_args()
    for n in range(args.launches):
        print(f"launch {n + 1}:")
        results = launch(pace_worker, 2, (args.rounds, args.reps, args.block), timeout=600)
        print("\n".join(summary(results)), flush=True)


if __name__ == "__main__":
    main()
