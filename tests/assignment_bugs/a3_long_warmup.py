"""Planted bug: one warm-up forward too many (p - s instead of p - s - 1)."""


def one_f_one_b(stages, microbatches):
    orders = []
    for s in range(stages):
        warmup = min(stages - s, microbatches)
        order = [("F", mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", warmup + i), ("B", i)]
        orders.append(order + [("B", mb) for mb in range(microbatches - warmup, microbatches)])
    return orders
