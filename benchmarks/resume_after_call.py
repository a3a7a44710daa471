"""What a compute right after a call pays, by its length and its kind: products, the unit's forward, the unit,
and tensor parallelism's own pieces.

    python benchmarks/resume_after_call.py [--gpus 2] [--rounds 8] [--model tiny-deep] [--batch 2]

On ``--gpus`` ranks (gloo, the executor's ring all-reduce), each round runs every compute 60 times in a row
twice, once right after a 16 KiB all-reduce each time and once without calls (the first 20 of each not kept),
every rank at once: small matrix products (calibration's short burst, about 0.3 ms), the unit's forward
(``_unit_burst(backward=False)``: what ``phase_worker`` times for ``resume_short``) and the unit
(``_unit_burst``: what ``resume`` is measured on); then tp's pieces of ``--model``'s layers (the executor's
``TensorParallelModel``: each piece with its continuation, as the executor counts it) with their real
all-reduces against completing them locally. Prints each one's mean time without and after the calls and the
difference. On the 2-core development VM (2026-11-27, 21:0x, 2 ranks, 8 and 16 rounds): the products paid
0.03 ms, the unit's forward (0.42-0.58 ms) 0.04-0.09 ms, the unit (1.2-1.6 ms) -0.15 and +0.24 ms (its runs
the noisiest), tp's pieces 0.13-0.14 ms forward (0.21-0.23 ms without calls) and 0.19-0.23 ms backward (0.40-0.46
ms): the rank computes slower for the first few tenths of a millisecond after a call, work of the executor's
kind (many small ops through Python and autograd) far more than the products (docs/calibration.md, "The
resume is paid at first"). The scripts it grew from (19:5x-20:0x) read the forward 0.10-0.18 ms, the unit
0.16-0.26 (0.61 once) and the products at most 0.02.
"""

from __future__ import annotations

import argparse
import statistics
import time

REPS, WARMUP = 60, 20


def computes(ctx, rounds: int) -> dict[str, dict[str, list[float]]]:
    import torch
    import torch.distributed as dist

    from simpar.calibrate.bench import SHORT_PHASE, _short_burst, _unit_burst
    from simpar.real.comm import CountingComm

    comm, group, flat = CountingComm(ctx.rank), list(range(ctx.world)), torch.zeros(4096)
    kinds = {"products": _short_burst(SHORT_PHASE), "forward": _unit_burst(backward=False), "unit": _unit_burst()}
    times = {kind: {"alone": [], "after": []} for kind in kinds}
    for _ in range(rounds):
        for kind, compute in kinds.items():
            for mode in ("alone", "after"):
                dist.barrier()
                for rep in range(REPS):
                    start = time.perf_counter()
                    compute()
                    took = time.perf_counter() - start
                    if mode == "after":
                        comm.ring_all_reduce(flat, group)
                    if rep >= WARMUP:
                        times[kind][mode].append(took)
    return times


def pieces(ctx, rounds: int, name: str, batch: int) -> dict[str, dict[str, list[float]]]:
    """tp's layer pieces, forward and backward, each with its continuation(s): {"fwd": {"alone": [s], "after":
    [s]}, "bwd": ...}, "after" with the executor's ring all-reduce between a piece and its continuation."""
    import torch.distributed as dist

    from simpar.calibrate.tp_bench import step_pieces
    from simpar.models import model
    from simpar.real.comm import CountingComm
    from simpar.real.model import build_model, synthetic_batch
    from simpar.real.tensor_parallel import TensorParallelModel

    spec = model(name)
    comm, group = CountingComm(ctx.rank), list(range(ctx.world))
    shard = TensorParallelModel(build_model(spec), ctx.rank, ctx.world)
    ids, targets = synthetic_batch(spec, batch, 0)
    last = len(shard.units) - 1
    times = {phase: {"alone": [], "after": []} for phase in ("fwd", "bwd")}

    def timed(phase, unit, start, reduction, mode, keep):
        took = time.perf_counter() - start
        while reduction is not None:
            if mode == "after":
                flat = reduction.tensor.reshape(-1).clone()
                result = comm.ring_all_reduce(flat, group, reduction.op).view_as(reduction.tensor)
            else:
                result = reduction.tensor.clone()
            start = time.perf_counter()
            reduction = reduction.then(result)
            took += time.perf_counter() - start
        if keep and 0 < unit < last:  # a layer's pieces
            times[phase][mode].append(took)

    for _ in range(rounds):
        for mode in ("alone", "after"):
            dist.barrier()
            for step in range(10):
                for phase, unit, piece in step_pieces(shard, ids, targets):
                    start = time.perf_counter()
                    timed(phase, unit, start, piece(), mode, step >= 2)
    return times


def worker(ctx, rounds: int, name: str, batch: int) -> dict:
    return {**computes(ctx, rounds), **{f"tp {phase}": t for phase, t in pieces(ctx, rounds, name, batch).items()}}


def summary(ranks: list[dict]) -> dict[str, tuple[float, float, float]]:
    """Per compute: (mean seconds without calls, right after a call, the difference), over every rank."""
    out = {}
    for kind in ranks[0]:
        alone = statistics.fmean(t for r in ranks for t in r[kind]["alone"])
        after = statistics.fmean(t for r in ranks for t in r[kind]["after"])
        out[kind] = (alone, after, after - alone)
    return out


def main() -> None:
    from simpar.real.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", default="tiny-deep")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    ranks = launch(worker, args.gpus, (args.rounds, args.model, args.batch), timeout=1800)
    print(f"{args.gpus} ranks, {args.rounds} rounds; mean per compute, every rank")
    print(f"{'compute':<10} {'no calls':>10} {'after a call':>13} {'resume':>9}")
    for kind, (alone, after, resume) in summary(ranks).items():
        print(f"{kind:<10} {1e6 * alone:>8.0f}us {1e6 * after:>11.0f}us {1e6 * resume:>+7.0f}us")


if __name__ == "__main__":
    main()
