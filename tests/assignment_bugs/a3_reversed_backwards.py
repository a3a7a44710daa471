"""Planted bug: the drain runs its backwards newest first."""
from instructor.solutions.a3 import one_f_one_b as _right


def one_f_one_b(stages, microbatches):
    orders = []
    for order in _right(stages, microbatches):
        tail = [i for i, (kind, _) in enumerate(order) if i >= len(order) - (stages - 1) and kind == "B"]
        drained = [order[i] for i in tail][::-1]
        orders.append(order[:len(order) - len(tail)] + drained)
    return orders
