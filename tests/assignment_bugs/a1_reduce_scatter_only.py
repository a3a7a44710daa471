"""Planted bug: stops after the reduce-scatter (each rank has one chunk's sum, not all)."""
from instructor.solutions.a1 import chunk_bytes  # noqa: F401
from instructor.solutions.a1 import ring_allreduce_schedule as _full


def ring_allreduce_schedule(world, nbytes):
    return _full(world, nbytes)[:world - 1]


def ring_allreduce(tensor, comm):
    import torch

    n, i = comm.world, comm.rank
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    for k in range(n - 1):
        send, into = (i - k) % n, (i - k - 1) % n
        incoming = torch.empty_like(chunks[into])
        comm.send_recv(chunks[send], (i + 1) % n, incoming, (i - 1) % n)
        chunks[into] += incoming
