"""A1 - your ring all-reduce. Fill in both functions; `pytest assignments/a1` grades them.

Chunks: split the data into `world` chunks the way torch.tensor_split does (the first
`nbytes % world` chunks one byte - or element - larger). Rank i sends only to (i + 1) % world and
receives only from (i - 1) % world.
"""

from __future__ import annotations


def ring_allreduce_schedule(world: int, nbytes: int) -> list[list[tuple[int, int, int, int]]]:
    """The ring all-reduce of `nbytes` over `world` ranks as a list of steps. A step is a list of
    sends that happen at once, each `(src, dst, chunk, nbytes_of_that_chunk)`. First a
    reduce-scatter (after it every rank holds the complete sum of one chunk), then an all-gather
    (every rank ends with every chunk's sum)."""
    raise NotImplementedError("A1: write ring_allreduce_schedule")


def ring_allreduce(tensor, comm) -> None:
    """Sum `tensor` over all ranks, in place, following your schedule. Use only
    `comm.send_recv(send_tensor, dst, recv_tensor, src)` (sends one tensor while receiving into
    another); `comm.rank` and `comm.world` tell you who you are."""
    raise NotImplementedError("A1: write ring_allreduce")
