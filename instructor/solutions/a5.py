"""A5 reference: pairwise all-to-all and capacity-bound token dispatch."""

from __future__ import annotations


def alltoall_schedule(world: int, nbytes: int) -> list[list[tuple[int, int, int]]]:
    """Step k (1..N-1): rank i sends its chunk for rank i + k, and receives rank i - k's."""
    base, extra = divmod(nbytes, world)
    sizes = [base + (1 if j < extra else 0) for j in range(world)]
    return [[(i, (i + k) % world, sizes[(i + k) % world]) for i in range(world)] for k in range(1, world)]


def dispatch_buffer(tokens, expert, experts: int, capacity: int):
    import torch

    buffer = tokens.new_zeros(experts, capacity, tokens.shape[1])
    slot = torch.full((tokens.shape[0],), -1, dtype=torch.long)
    used = [0] * experts
    for t, e in enumerate(expert.tolist()):
        if used[e] < capacity:
            buffer[e, used[e]] = tokens[t]
            slot[t] = used[e]
            used[e] += 1
    return buffer, slot


def all_to_all(chunks, comm):
    import torch

    n, i = comm.world, comm.rank
    received = [None] * n
    received[i] = chunks[i].clone()
    for k in range(1, n):
        to, source = (i + k) % n, (i - k) % n
        received[source] = torch.empty_like(chunks[source])
        comm.send_recv(chunks[to].contiguous(), to, received[source], source)
    return received


def combine(outputs, expert, slot):
    kept = slot >= 0
    out = outputs.new_zeros(slot.shape[0], outputs.shape[2])
    out[kept] = outputs[expert[kept], slot[kept]]
    return out
