"""What the executor does with the data around ZeRO's calls, timed on one rank right after each of its steps.

The all-reduce op that ``compute_worker`` times (``reduce_s``) concatenates a bucket's gradient tensors into
one buffer, scales it and re-points each gradient into the result. ZeRO-1 and 2's all-gather of parameters
held whole copies the gathered buffer into each parameter instead (``time_gather``), ZeRO-2's reduce-scatter
keeps its chunk and drops each gradient (``time_scatter``), and a later micro-batch's backward adds its
gradients into those an earlier one left (``time_accumulate``). One rank skips those calls (its shard is the
whole), so they are timed here with the executor's own code.
"""

from __future__ import annotations

import time


def time_gather(states) -> float:
    """Seconds ``states`` (a one-rank ModelStates) takes to copy a buffer of all its units' parameters into
    them, as an all-gather of parameters held whole hands them back."""
    units = tuple(states.held)
    flat = states.flat(units, "data")  # what the all-gather returns: the whole buffer
    began = time.perf_counter()
    states.unflatten(units, flat, "data")
    return time.perf_counter() - began


def time_scatter(states) -> float:
    """Seconds ZeRO-2's handling of its gradients around a reduce-scatter takes on ``states`` (a one-rank
    ModelStates): the gradients concatenated into one buffer (``ModelStates.flat``), the rank's chunk
    scaled and kept, and each gradient dropped (``ModelStates.reduced`` with sharded gradients), where
    the all-reduce's handling re-points every gradient into the result instead (``reduce_s``). Each
    parameter is first given a gradient, untimed (the step has just dropped them)."""
    import torch

    units = tuple(states.held)
    params = [p for u in units for p in states.unit_params[u]]
    for p in params:
        p.grad = torch.zeros_like(p)
    began = time.perf_counter()
    flat = states.flat(units, "grad")
    kept = 0 + flat / 1  # one rank: its chunk is the whole buffer, scaled and kept as the shard
    for p in params:
        p.grad = None
    seconds = time.perf_counter() - began
    del kept
    return seconds


ACCUMULATE_PAIRS = 3  # backward pairs one reading averages


def time_accumulate(states) -> float:
    """Seconds autograd's ``AccumulateGrad`` takes, over every parameter of ``states`` (a one-rank
    ModelStates), to add a micro-batch's gradient into the one an earlier micro-batch left (an in-place add
    a tensor) beyond taking it over as it is (the first micro-batch's, whose gradients are None after the
    optimizer's ``zero_grad(set_to_none=True)``). Every micro-batch after the first pays it inside its
    units' backward. Timed as the same backward run both ways, the difference: one graph
    of ``p * 1.0`` per parameter, its incoming gradient a new tensor that autograd takes over or adds, as
    in a unit's backward. Each parameter's gradient is None again afterwards."""
    import torch

    params = [p for u in states.held for p in states.unit_params[u]]

    def backward(held: bool) -> float:
        for p in params:
            p.grad = torch.zeros_like(p) if held else None
        outputs = [p * 1.0 for p in params]
        grads = [torch.ones_like(o) for o in outputs]
        began = time.perf_counter()
        torch.autograd.backward(outputs, grads)
        return time.perf_counter() - began

    differences = []
    for pair in range(ACCUMULATE_PAIRS):  # the order alternated: neither way always meets the warmer caches
        order = (False, True) if pair % 2 == 0 else (True, False)
        seconds = {held: backward(held) for held in order}
        differences.append(seconds[True] - seconds[False])
    for p in params:
        p.grad = None
    return sum(differences) / len(differences)
