"""Planted bug: stage s defers p - 1 - s W passes (the first stage the most) instead of s."""


def zb_h1(stages, microbatches):
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order, deferred = [("F", mb) for mb in range(warmup)], []
        for i in range(microbatches):
            if warmup + i < microbatches:
                order.append(("F", warmup + i))
            order.append(("B", i))
            deferred.append(i)
            if len(deferred) > (stages - 1 - s if warmup + i < microbatches else 0):
                order.append(("W", deferred.pop(0)))
        orders.append(order + [("W", mb) for mb in deferred])
    return orders
