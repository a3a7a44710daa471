"""Micro-benchmarks of a pipeline's point-to-point traffic in the two orders 1F1B meets (``relay_worker``: the
receive waits for the send; ``late_worker``: the send for the receive), with the executor's own calls."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from simpar.calibrate.bench import _unit_burst
from simpar.real.comm import CountingComm

LATE_SIZES = (2**12, 2**16)  # bytes: 4 KiB, and a small-model activation at micro-batch 2 (64 KiB)


def relay_worker(ctx, laps: int) -> dict:
    """A token relayed round the ranks (receive, compute, ``isend`` on), one rank computing at a time, each
    computing the unit right after its receive and once more: {"after": [s], "again": [s]}; the difference is
    what a compute right after a blocking receive pays."""
    comm, rank, n = CountingComm(ctx.rank), ctx.rank, ctx.world
    unit, token = _unit_burst(), torch.zeros(1024)
    after, again = [], []
    for _ in range(3):
        unit()
    dist.barrier()
    for lap in range(laps + 2):
        if rank or lap:
            comm.recv(token, (rank - 1) % n)
        began = time.perf_counter()
        unit()
        middle = time.perf_counter()
        unit()
        if lap >= 2:  # the first laps warm the connections up
            after.append(middle - began)
            again.append(time.perf_counter() - middle)
        comm.isend(token, (rank + 1) % n).wait()
    if rank == 0:
        comm.recv(token, n - 1)
    dist.barrier()
    return {"after": after, "again": again}


def late_worker(ctx, laps: int, sizes: tuple[int, ...] = LATE_SIZES) -> dict:
    """A receive posted after its send while the sender computes (how a 1F1B stage most often meets its
    neighbour's activations; gloo moves the data only once both ends have posted, from a thread on the busy
    sender's core). Ranks pair up and swap roles lap by lap. {str(bytes): [seconds of each late receive]}."""
    comm, rank, n = CountingComm(ctx.rank), ctx.rank, ctx.world
    unit, partner = _unit_burst(), rank ^ 1
    for _ in range(3):
        unit()
    out: dict[str, list[float]] = {}
    for size in sizes:
        dist.barrier()
        if partner >= n:
            for _ in range(laps + 2):
                unit()
                unit()
            out[str(size)] = []
        else:
            out.update(_late_laps(comm, rank, partner, unit, laps, (size,)))
    dist.barrier()
    return out


def _late_laps(comm: CountingComm, rank: int, partner: int, unit, laps: int, sizes: tuple[int, ...]) -> dict:
    """One pair's late receives: the sender ``isend``s, computes twice, waits; the receiver computes once, then
    posts its receive, timed."""
    out: dict[str, list[float]] = {}
    for size in sizes:
        message, took = torch.zeros(max(size // 4, 1)), []
        for lap in range(laps + 2):
            if (lap + rank) % 2 == 0:  # the sender
                request = comm.isend(message, partner)
                unit()
                unit()
                request.wait()
            else:
                unit()
                began = time.perf_counter()
                comm.recv(message, partner)
                if lap >= 2:  # the first laps warm the connections up
                    took.append(time.perf_counter() - began)
                unit()
        out[str(size)] = took
    return out


def late_recv_cost(late_by_rank: list[dict], bytes_per_s: float) -> float:
    """Seconds a late receive takes beyond its bytes at ``bytes_per_s``: the mean over sizes of each size's mean
    (not the median: a step pays the tail too); 0 without records."""
    per_size = []
    for size in late_by_rank[0] if late_by_rank else ():
        seconds = [t for rank in late_by_rank for t in rank.get(size, [])]
        if seconds:
            per_size.append(sum(seconds) / len(seconds) - int(size) / bytes_per_s)
    return max(sum(per_size) / len(per_size), 0.0) if per_size else 0.0
