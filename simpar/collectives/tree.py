"""Tree algorithms, pipelined in small chunks so every tree edge streams at once.

All-reduce uses a *double binary tree* (as NCCL does): two in-order binary trees, the second
shifted by one rank so that (for odd N) the first tree's leaves are the second's inner nodes.
Each tree reduces half of the data up to its root and broadcasts it back down, so every rank
sends and receives about S in each direction while the depth, not N, sets the latency.
Pipelining is modelled as every edge streaming its bytes concurrently after a fill of one
latency per tree level.
"""

from __future__ import annotations

from simpar.collectives.schedule import Phase, Transfer, chunk_sizes


def inorder_edges(n: int) -> tuple[list[tuple[int, int]], int]:
    """(child, parent) edges of the in-order binary tree on positions 0..n-1, and its depth."""
    edges: list[tuple[int, int]] = []

    def build(lo: int, hi: int, parent: int | None, depth: int) -> int:
        if lo > hi:
            return depth - 1
        mid = (lo + hi) // 2
        if parent is not None:
            edges.append((mid, parent))
        return max(build(lo, mid - 1, mid, depth + 1), build(mid + 1, hi, mid, depth + 1))

    return edges, max(build(0, n - 1, None, 0), 0)


def heap_edges(n: int) -> tuple[list[tuple[int, int]], int]:
    """(child, parent) edges of the heap-ordered binary tree rooted at position 0, and its depth."""
    return [(p, (p - 1) // 2) for p in range(1, n)], max(n.bit_length() - 1, 0)


def all_reduce(group: list[str], nbytes: int) -> list[Phase]:
    n = len(group)
    edges, depth = inorder_edges(n)
    halves = chunk_sizes(nbytes, 2)
    up, down = [], []
    for shift, half in ((0, halves[0]), (1, halves[1])):
        rank = [group[(p + shift) % n] for p in range(n)]
        for child, parent in edges:
            up.append(Transfer(rank[child], rank[parent], half, steps=depth))
            down.append(Transfer(rank[parent], rank[child], half, steps=depth))
    return [Phase("double-tree reduce", tuple(up)), Phase("double-tree broadcast", tuple(down))]


def broadcast(group: list[str], nbytes: int, root: int = 0) -> list[Phase]:
    n = len(group)
    edges, depth = heap_edges(n)
    rank = [group[(root + p) % n] for p in range(n)]
    return [Phase("tree broadcast", tuple(
        Transfer(rank[parent], rank[child], nbytes, steps=depth) for child, parent in edges))]


def reduce(group: list[str], nbytes: int, root: int = 0) -> list[Phase]:
    n = len(group)
    edges, depth = heap_edges(n)
    rank = [group[(root + p) % n] for p in range(n)]
    return [Phase("tree reduce", tuple(
        Transfer(rank[child], rank[parent], nbytes, steps=depth) for child, parent in edges))]
