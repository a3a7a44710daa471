"""What the executor does with the data around ZeRO's calls, timed on one rank after each step with its own
code (one rank skips those calls): ZeRO-1/2's all-gather copies the buffer into each parameter, ZeRO-2's
reduce-scatter keeps its chunk and drops each gradient, a later micro-batch adds its gradients in."""

from __future__ import annotations

import time


def time_gather(states) -> float:
    """Seconds ``states`` (a one-rank ModelStates) takes to copy a buffer of all its parameters into them."""
    units = tuple(states.held)
    flat = states.flat(units, "data")  # what the all-gather returns: the whole buffer
    began = time.perf_counter()
    states.unflatten(units, flat, "data")
    return time.perf_counter() - began


def time_scatter(states) -> float:
    """Seconds ZeRO-2's handling of its gradients around a reduce-scatter takes: concatenated, the chunk scaled
    and kept, each gradient dropped (each parameter first given a gradient, untimed)."""
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
    """Seconds autograd takes, over every parameter, to add a micro-batch's gradient into a held one beyond
    taking it over (the first micro-batch's): the same backward of ``p * 1.0`` per parameter both ways."""
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
