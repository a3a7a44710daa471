"""Planted bug: passes the whole running sum around the ring (right sums, N times the bytes)."""


def ring_allreduce_schedule(world, nbytes):
    return [[(i, (i + 1) % world, 0, nbytes) for i in range(world)] for _ in range(2 * (world - 1))]


def ring_allreduce(tensor, comm):
    import torch

    n, i = comm.world, comm.rank
    total, passing = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(passing)
        comm.send_recv(passing, (i + 1) % n, incoming, (i - 1) % n)
        total += incoming
        passing = incoming
    tensor.copy_(total)
