"""Micro-benchmarks of a pipeline's point-to-point traffic, run as ``launch`` workers: how its stages
hand activations on, in the two orders 1F1B meets (``relay_worker``: the receive waits for the send;
``late_worker``: the send waits for the receive). Both use the executor's own ``isend`` and blocking
``recv`` (``CountingComm``) and ``pattern_worker``'s unit of compute."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from simpar.calibrate.bench import _unit_burst
from simpar.real.comm import CountingComm

LATE_SIZES = (2**12, 2**16)  # bytes: 4 KiB, and a small-model activation at micro-batch 2 (64 KiB)


def relay_worker(ctx, laps: int) -> dict:
    """A pipeline's turn-taking: a token relayed round the ranks (receive from the rank behind, compute,
    ``isend`` on), one rank computing at a time. Each rank computes the unit right after its receive,
    then once more: {"after": [s], "again": [s]}; their difference is what a compute right after a
    blocking receive pays, measured where ``pattern_worker``'s all-at-once compute (every rank sharing the
    cores, a slowdown several times larger than the effect at 4 and 8 ranks) cannot see it."""
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
    """A receive posted after its send, the sender computing: the order in which a 1F1B stage most
    often meets its neighbour's activations (sent as soon as computed, received once the stage is done
    with its own work). gloo moves a message only once both ends have posted it: the sender's
    ``isend`` announces it, the receiver's ``recv`` answers, and the sender's gloo thread, on a core its
    own rank is computing on, writes the data. Ranks pair up (0-1, 2-3, ...; an odd one out computes
    alone) and swap roles lap by lap; every rank computes at once. {str(bytes): [seconds of each late
    receive]} (``_late_laps``)."""
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
    """One pair's late receives, roles swapped lap by lap: the sender ``isend``s, computes the unit twice,
    then waits on the send; the receiver computes the unit once, then posts its receive, timed, so the
    receive is posted while the sender computes. {str(bytes): [seconds of each late receive]}."""
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
    """Seconds a late receive takes beyond moving its bytes, from every rank's ``late_worker`` record:
    the mean over sizes of each size's mean receive less its bytes at ``bytes_per_s`` (the ring step's
    bandwidth); the mean, not the median, as a step pays the tail too (now and then a scheduler tick: the
    sender's gloo thread waits for a core its rank computes on). 0 without records."""
    per_size = []
    for size in late_by_rank[0] if late_by_rank else ():
        seconds = [t for rank in late_by_rank for t in rank.get(size, [])]
        if seconds:
            per_size.append(sum(seconds) / len(seconds) - int(size) / bytes_per_s)
    return max(sum(per_size) / len(per_size), 0.0) if per_size else 0.0
