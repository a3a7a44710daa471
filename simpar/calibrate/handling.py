"""What the executor does with the data around ZeRO's all-gather of parameters, timed on one rank.

The all-reduce op that ``compute_worker`` times (``reduce_s``: ``tensor_work``) concatenates a bucket's
gradient tensors into one buffer, scales it and re-points each gradient into the result. ZeRO-1 and 2's
all-gather of the parameters (which every rank holds whole) concatenates nothing: it copies the gathered
buffer into each parameter (``ModelStates.gathered``). Priced as the all-reduce, it cost tiny-deep
2.8 ms where the copy takes 1.6 ms (one rank, 2026-11-25), at every world size, twice a step for ZeRO-1
and 2 (docs/calibration.md). One rank skips the all-gather op (its shard is the whole), so the copy is
timed here directly, with the executor's own code, right after each of its steps.
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
