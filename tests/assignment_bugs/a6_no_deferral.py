"""Planted bug: every W straight after its B - 1F1B with the backward split, which keeps 1F1B's bubble."""


def zb_h1(stages, microbatches):
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = [("F", mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", warmup + i), ("B", i), ("W", i)]
        for mb in range(microbatches - warmup, microbatches):
            order += [("B", mb), ("W", mb)]
        orders.append(order)
    return orders
