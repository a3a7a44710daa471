"""Planted bug: every W deferred to the end of the step - no bubble to fill there, and m micro-batches of
inputs held for their W instead of at most p."""


def zb_h1(stages, microbatches):
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = [("F", mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", mb) for mb in range(microbatches - warmup, microbatches)]
        orders.append(order + [("W", mb) for mb in range(microbatches)])
    return orders
