"""Gradient accumulation as the executor's backward pays it: which backward ops add into held gradients.

A unit's backward hands each parameter's gradient to autograd's ``AccumulateGrad``: with no gradient held
(the first micro-batch after the optimizer's ``zero_grad(set_to_none=True)``, or after ZeRO-2/3's
reduce-scatter dropped it) it takes the new tensor over; with one held it adds into it in place, an op per
tensor. On one rank of the development VM that add cost tiny-deep's layer (16 tensors, 50 K parameters)
about 20 us of a 550 us backward at micro-batch 2, every micro-batch after the first (pp at 2 ranks: 3 of
its 4; ``calibrate/handling.py``'s ``time_accumulate``). Priced only on a calibrated profile: on GPUs
Megatron fuses the accumulation into the weight-gradient GEMM (``gradient_accumulation_fusion``), so the
kernel model charges nothing for it.
"""

from __future__ import annotations

from simpar.plan import Collective, Compute, Program


def accumulating(prog: Program, dropped_by_reduce_scatter: bool) -> list[Compute]:
    """``prog``'s backward computes that find their unit's gradients held from an earlier micro-batch
    of the step, in the program's order: a unit's gradients are held from its first backward on, until the
    optimizer's step (which sets them to None) or, where ``dropped_by_reduce_scatter`` (the ranks keep only
    their reduced shard: ZeRO-2 and 3), a reduce-scatter of its gradients."""
    held: set[tuple[int, str]] = set()  # (unit, piece): a tensor-parallel piece's parameters are its own
    ops: list[Compute] = []
    for op in prog.ops:
        if isinstance(op, Compute) and op.phase == "step":
            held.clear()
        elif isinstance(op, Compute) and op.phase == "bwd" and op.unit >= 0:
            if (op.unit, op.part) in held:
                ops.append(op)
            held.add((op.unit, op.part))
        elif (isinstance(op, Collective) and dropped_by_reduce_scatter and op.op == "reducescatter"
              and op.payload == "grads"):
            held = {(unit, part) for unit, part in held if unit not in op.units}
    return ops
