"""Ring algorithms: all-reduce = reduce-scatter + all-gather, each N-1 lock-step neighbour sends.

Chunk ownership follows torch's ``reduce_scatter_tensor``: after the reduce-scatter, rank i holds
the reduced chunk i. In reduce-scatter step k, rank i sends chunk (i-k-1) mod N to rank i+1, so
over the N-1 steps it sends every chunk but its own; in all-gather step k it sends chunk
(i-k) mod N, i.e. every chunk but chunk i+1. With uneven chunks the per-rank totals differ by
those few bytes, which is what a real run measures too.
"""

from __future__ import annotations

from simpar.collectives.schedule import Phase, Transfer, chunk_sizes, merge_phases


def ring_steps(op: str, world: int) -> int:
    """Ring steps of one call: an all-gather k - 1, an all-reduce (reduce-scatter + all-gather) 2(k - 1),
    a handoff one; of a Worker-Server all-reduce, its one-way legs: 2(k - 1), each the whole buffer."""
    if op == "handoff":
        return 1
    return (world - 1) * (2 if op in ("allreduce", "psreduce") else 1)


def element_chunks(nbytes: int, parts: int, itemsize: int = 1) -> list[int]:
    """Chunk sizes in bytes when a tensor of ``itemsize``-byte elements is split by elements."""
    return [c * itemsize for c in chunk_sizes(nbytes // itemsize, parts)]


def reduce_scatter(group: list[str], nbytes: int, itemsize: int = 1) -> list[Phase]:
    n = len(group)
    chunks = element_chunks(nbytes, n, itemsize)
    return [Phase("ring reduce-scatter", tuple(
        Transfer(group[i], group[(i + 1) % n], nbytes - chunks[i], steps=n - 1)
        for i in range(n) if n > 1))]


def all_gather(group: list[str], nbytes: int, itemsize: int = 1) -> list[Phase]:
    """``nbytes`` is the gathered (output) size, as in nccl-tests."""
    n = len(group)
    chunks = element_chunks(nbytes, n, itemsize)
    return [Phase("ring all-gather", tuple(
        Transfer(group[i], group[(i + 1) % n], nbytes - chunks[(i + 1) % n], steps=n - 1)
        for i in range(n) if n > 1))]


def all_reduce(group: list[str], nbytes: int, itemsize: int = 1) -> list[Phase]:
    return reduce_scatter(group, nbytes, itemsize) + all_gather(group, nbytes, itemsize)


def broadcast(group: list[str], nbytes: int, root: int = 0) -> list[Phase]:
    """A pipelined chain from the root: every hop carries all bytes; filling the pipe costs one
    latency per hop, so T ~ (N-1)·alpha + S/B."""
    n = len(group)
    order = [group[(root + k) % n] for k in range(n)]
    return [Phase("chain broadcast", tuple(
        Transfer(order[k], order[k + 1], nbytes, steps=n - 1) for k in range(n - 1)))]


def reduce(group: list[str], nbytes: int, root: int = 0) -> list[Phase]:
    """The broadcast chain run backwards, reducing into the root."""
    n = len(group)
    order = [group[(root + k) % n] for k in range(n)]
    return [Phase("chain reduce", tuple(
        Transfer(order[k + 1], order[k], nbytes, steps=n - 1) for k in range(n - 1)))]


def channel_orders(group: list[str], machine_of) -> list[list[str]]:
    """Ring orders for a group, one per *channel*, as NCCL builds them.

    Within one machine (or when machines hold unequal numbers of ranks) there is one ring in
    group order. Across machines of L ranks each there are L rings, ring c visiting each
    machine's ranks rotated by c, so each ring leaves a machine through a different GPU (and so
    through that GPU's NIC): together they use every NIC instead of one.
    """
    machines: dict = {}
    for rank in group:
        machines.setdefault(machine_of(rank), []).append(rank)
    local = {len(m) for m in machines.values()}
    if len(machines) < 2 or len(local) != 1 or local == {1}:
        return [list(group)]
    size = local.pop()
    return [[m[(j + c) % size] for m in machines.values() for j in range(size)] for c in range(size)]


def over_channels(fn, orders: list[list[str]], nbytes: int, itemsize: int = 1) -> list[Phase]:
    """Split the elements evenly over the channel rings and run them side by side."""
    parts = element_chunks(nbytes, len(orders), itemsize)
    return merge_phases(*(fn(order, part, itemsize) for order, part in zip(orders, parts)))
