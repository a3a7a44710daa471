"""A6 reference: the ZB-H1 order of forwards (F), input gradients (B) and weight gradients (W) on each stage."""

from __future__ import annotations


def zb_h1(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Stage s: 1F1B's p - s - 1 warm-up forwards, then F and B in turn; each B is followed by the W of the
    micro-batch s places back (the stage keeps s weight gradients deferred, which fill the bubble 1F1B leaves
    at its end); after the last forward each B takes its W at once, and the deferred W's close the step."""
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order, deferred = [("F", mb) for mb in range(warmup)], []
        for i in range(microbatches):
            if warmup + i < microbatches:
                order.append(("F", warmup + i))
            order.append(("B", i))
            deferred.append(i)
            if len(deferred) > (s if warmup + i < microbatches else 0):
                order.append(("W", deferred.pop(0)))
        orders.append(order + [("W", mb) for mb in deferred])
    return orders
