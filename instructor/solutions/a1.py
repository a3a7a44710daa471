"""A1 reference: ring all-reduce as a reduce-scatter then an all-gather around the ring."""

from __future__ import annotations


def chunk_bytes(nbytes: int, world: int) -> list[int]:
    base, extra = divmod(nbytes, world)
    return [base + (1 if i < extra else 0) for i in range(world)]


def ring_allreduce_schedule(world: int, nbytes: int) -> list[list[tuple[int, int, int, int]]]:
    """2(N-1) steps; in step k every rank i sends one chunk to i+1. Reduce-scatter (k < N-1): rank i
    sends chunk (i - k) mod N, which its right neighbour adds to its own partial sum; after N-1 steps
    rank i holds the full sum of chunk (i + 1) mod N. All-gather: rank i forwards chunk (i + 1 - k) mod N."""
    sizes = chunk_bytes(nbytes, world)
    steps = []
    for k in range(world - 1):
        steps.append([(i, (i + 1) % world, (i - k) % world, sizes[(i - k) % world]) for i in range(world)])
    for k in range(world - 1):
        steps.append([(i, (i + 1) % world, (i + 1 - k) % world, sizes[(i + 1 - k) % world]) for i in range(world)])
    return steps


def ring_allreduce(tensor, comm) -> None:
    """Sum ``tensor`` over all ranks in place, with the schedule above and ``comm.send_recv``."""
    import torch

    n, i = comm.world, comm.rank
    if n == 1:
        return
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    right, left = (i + 1) % n, (i - 1) % n
    for k in range(n - 1):
        send, into = (i - k) % n, (i - k - 1) % n
        incoming = torch.empty_like(chunks[into])
        comm.send_recv(chunks[send], right, incoming, left)
        chunks[into] += incoming
    for k in range(n - 1):
        send, into = (i + 1 - k) % n, (i - k) % n
        comm.send_recv(chunks[send], right, chunks[into], left)
