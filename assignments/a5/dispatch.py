"""A5 - your all-to-all token dispatch. Fill in the four functions; `pytest assignments/a5` grades them."""

from __future__ import annotations


def alltoall_schedule(world: int, nbytes: int) -> list[list[tuple[int, int, int]]]:
    """The pairwise all-to-all of each rank's `nbytes` buffer (chunk j, as torch.tensor_split cuts it,
    for rank j; a rank keeps its own chunk): steps of `(src, dst, nbytes_sent)` sends that happen at once."""
    raise NotImplementedError("A5: write alltoall_schedule")


def dispatch_buffer(tokens, expert, experts: int, capacity: int):
    """(buffer of shape (experts, capacity, hidden), slot of each token: -1 when dropped). Tokens take
    their expert's next free slot in token order; those past the capacity are dropped."""
    raise NotImplementedError("A5: write dispatch_buffer")


def all_to_all(chunks, comm):
    """Send `chunks[j]` to rank j (keep your own) and return a list whose entry j is what rank j sent you
    (shaped like `chunks[j]`). Use only `comm.send_recv(send, dst, recv, src)`; `comm.rank`, `comm.world`."""
    raise NotImplementedError("A5: write all_to_all")


def combine(outputs, expert, slot):
    """Each token's row of `outputs` (experts, capacity, hidden) at its expert and slot; zeros if dropped."""
    raise NotImplementedError("A5: write combine")
