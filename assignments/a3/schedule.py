"""A3 - your 1F1B pipeline schedule. `pytest assignments/a3` grades it."""

from __future__ import annotations


def one_f_one_b(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """For each stage s = 0 .. stages-1, the order in which it runs its passes: ("F", mb) is the
    forward of micro-batch mb, ("B", mb) its backward. 1F1B (PipeDream-Flush): a few warm-up
    forwards, then alternate one forward and one backward, then drain the backwards - so that
    stage s never holds the activations of more than stages - s micro-batches at once."""
    raise NotImplementedError("A3: write one_f_one_b")
