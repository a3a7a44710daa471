"""What the executor does with the data around ZeRO's all-gather of parameters, timed on one rank.

The all-reduce op that ``compute_worker`` times (``reduce_s``: ``tensor_work``) concatenates a bucket's
gradient tensors into one buffer, scales it and re-points each gradient into the result. ZeRO-1 and 2's
all-gather of the parameters (which every rank holds whole) concatenates nothing: it copies the gathered
buffer into each parameter (``ModelStates.gathered``). Priced as the all-reduce, it cost tiny-deep
2.8 ms where the copy takes 1.6 ms (one rank, 2026-11-25), at every world size, twice a step for ZeRO-1
and 2 (docs/calibration.md). One rank skips the all-gather op (its shard is the whole), so the copy is
timed here directly, with the executor's own code, right after each of its steps. So is the executor's
own work between ops (``between_ops``), read off the same one-rank steps, and ZeRO-2's handling of its
gradients around the reduce-scatter (``time_scatter``): it keeps its chunk alone and drops each gradient,
where ZeRO-1 re-points every gradient into the reduced buffer as the all-reduce does. And the
concatenation of the gradients inside the optimizer's step (``concat_timer``), which ZeRO-2 and 3 do not make,
and the same concatenation as the backward leaves the gradients (``ColdConcat``), where no data-parallel call's
handling has touched them since: tensor and pipeline parallelism's step.
And what autograd pays to add a micro-batch's gradients into those an earlier one left (``time_accumulate``).
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


def concat_timer(states) -> list[float]:
    """Seconds of each concatenation of the held gradients inside ``states``' optimizer step, appended to the
    list returned as the steps run: ``ModelStates.step`` flattens the gradients of the units it steps into
    one tensor (``ModelStates.flat``) before Adam steps it or its shard (DDP, ZeRO-1, pp, tp), where ZeRO-2
    and 3 step the reduced shard they kept. Timed inside the executor's own step, as the step meets it."""
    times: list[float] = []
    flat, step = states.flat, states.step
    inside = False

    def timed_flat(units, what: str):
        if not (inside and what == "grad"):
            return flat(units, what)
        began = time.perf_counter()
        out = flat(units, what)
        times.append(time.perf_counter() - began)
        return out

    def timed_step() -> None:
        nonlocal inside
        inside = True
        try:
            step()
        finally:
            inside = False

    states.flat, states.step = timed_flat, timed_step
    return times


def between_ops(step_seconds: float, timeline: list[dict], ops: int) -> float:
    """Seconds per op of the plan that a step spends outside every timed op: the executor's own work
    between them (dispatching each op, its label and timer, Alloc and Free, which no op times). The
    calibrated unit costs are timed inside the ops, so without it the simulator missed this time:
    0.6 ms a step of 45 ops for DDP on one rank, 1.0 ms on two (2026-11-24)."""
    return max(step_seconds - sum(e["end"] - e["start"] for e in timeline), 0.0) / ops


ACCUMULATE_PAIRS = 3  # backward pairs one reading averages (tiny-deep's read 0.115 ms, SD 0.026, a step)


def time_accumulate(states) -> float:
    """Seconds autograd's ``AccumulateGrad`` takes, over every parameter of ``states`` (a one-rank
    ModelStates), to add a micro-batch's gradient into the one an earlier micro-batch left (an in-place add
    a tensor) beyond taking it over as it is (the first micro-batch's, whose gradients are None after the
    optimizer's ``zero_grad(set_to_none=True)``). Every micro-batch after the first pays it inside its
    units' backward: pp at 2 ranks, a tiny-deep layer's backward 653 us at its first micro-batch, 657-675
    us at the others (2026-11-29). Timed as the same backward run both ways, the difference: one graph
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


class ColdConcat:
    """Seconds of the gradients' concatenation (``ModelStates.flat``, as the optimizer's step makes it) right
    after the backward, before the one-rank all-reduce op's handling touches them (``times``, one per step
    while ``armed``): what a step meets where no data-parallel call comes between its backward and its
    optimizer (tp, pp). Inside the step op, after the handling has concatenated, scaled and re-pointed them,
    the gradients are hot: at 2 ranks the executor's tp step concatenated its 133 gradient tensors (220 K
    parameters) in 376-409 us, and again at once in 245-267 us; DDP's, after its all-reduce, 133 tensors of
    435 K parameters in 284-320 us, where ``concat_timer``'s fit (0.53 ns a parameter, no cost per tensor) priced
    tp's 117 us; one rank, tiny-deep: 297-340 us right after its backward, 228-264 us again at once
    (2026-12-01). Armed only in steps that are not timed: the concatenation warms the gradients for the
    handling that follows."""

    def __init__(self, executor):
        self.times: list[float] = []
        self.armed = False
        states, collective = executor.states, executor._collective

        def timed(op):
            if self.armed and op.payload == "grads":
                began = time.perf_counter()
                for units in states.optimized:
                    states.flat(units, "grad")
                self.times.append(time.perf_counter() - began)
            return collective(op)

        executor._collective = timed
