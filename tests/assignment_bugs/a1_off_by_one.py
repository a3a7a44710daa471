"""Planted bug: the all-gather forwards the wrong chunk (i - k instead of i + 1 - k)."""
from instructor.solutions.a1 import chunk_bytes


def ring_allreduce_schedule(world, nbytes):
    sizes = chunk_bytes(nbytes, world)
    steps = [[(i, (i + 1) % world, (i - k) % world, sizes[(i - k) % world]) for i in range(world)]
             for k in range(world - 1)]
    return steps + [[(i, (i + 1) % world, (i - k) % world, sizes[(i - k) % world]) for i in range(world)]
                    for k in range(world - 1)]


def ring_allreduce(tensor, comm):
    import torch

    n, i = comm.world, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    for k in range(n - 1):
        send, into = (i - k) % n, (i - k - 1) % n
        incoming = torch.empty_like(chunks[into])
        comm.send_recv(chunks[send], (i + 1) % n, incoming, (i - 1) % n)
        chunks[into] += incoming
    for k in range(n - 1):
        send, into = (i - k) % n, (i - k - 1) % n
        comm.send_recv(chunks[send], (i + 1) % n, chunks[into], (i - 1) % n)
