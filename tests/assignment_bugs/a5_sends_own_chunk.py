"""Planted bug: every rank also sends its own chunk (to the next rank, which discards it): right outputs,
1/(N-1) more bytes than the all-to-all needs."""
from instructor.solutions.a5 import all_to_all as _right
from instructor.solutions.a5 import alltoall_schedule, combine, dispatch_buffer  # noqa: F401


def all_to_all(chunks, comm):
    import torch

    n, i = comm.world, comm.rank
    spare = torch.empty_like(chunks[(i - 1) % n])
    comm.send_recv(chunks[i].contiguous(), (i + 1) % n, spare, (i - 1) % n)
    return _right(chunks, comm)
