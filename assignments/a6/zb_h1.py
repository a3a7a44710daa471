"""A6 - your ZB-H1 pipeline schedule. `pytest assignments/a6` grades it."""

from __future__ import annotations


def zb_h1(stages: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """For each stage s = 0 .. stages-1, the order in which it runs its passes: ("F", mb) is the forward of
    micro-batch mb, ("B", mb) its input-gradient pass, ("W", mb) its weight-gradient pass. ZB-H1: 1F1B's
    forwards and B's, with stage s keeping s W passes deferred to fill the bubble 1F1B leaves."""
    raise NotImplementedError("A6: write zb_h1")
