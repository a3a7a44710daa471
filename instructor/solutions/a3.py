"""A3 reference: the 1F1B (PipeDream-Flush) order of forwards and backwards on each stage."""

from __future__ import annotations


def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Stage s: p - s - 1 warm-up forwards, then a forward and a backward in turn, then the rest
    of the backwards; so it never holds more than p - s micro-batches of activations."""
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = [("F", mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", warmup + i), ("B", i)]
        orders.append(order + [("B", mb) for mb in range(microbatches - warmup, microbatches)])
    return orders
