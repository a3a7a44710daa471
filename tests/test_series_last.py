"""The last call of a series, the one a compute follows (``series_last``): fitted from the executor's own
series, and what the simulator prices with it (ZeRO-3's parameter gathers before a compute)."""

import pytest

from simpar.plan import Alloc, Collective, Compute, Free
from tests.test_series_late import _zero3
from tests.test_series_level import assert_priced_per_gather


def _marks(later: float, last: float = 2.6) -> list[float]:
    """One repetition's [compute end, each call's end] (s): calls of 3, 2, 2, 2, five of ``later``, ``last`` ms."""
    calls = [3, 2, 2, 2] + [later] * 5 + [last]
    return [1e-3 * sum(calls[:i]) for i in range(len(calls) + 1)]


def test_the_last_call_is_paired_with_the_fifth_to_last_but_one_repetition_by_repetition():
    """The later calls 1.5 or 1.4 ms (every other repetition), the last 2.6: it pays 1.15 ms more, averaged over
    the ranks first (rank 1's later calls 0.1 ms longer: 1.1); a last call that swings within twice its
    standard error of 0, or a series too short to have later calls, tells nothing."""
    from simpar.calibrate.series import series_last

    reps = [_marks(1.5), _marks(1.4)] * 3
    assert series_last([reps, reps]) == pytest.approx(1.15e-3)
    assert series_last([reps, [_marks(1.6), _marks(1.5)] * 3]) == pytest.approx(1.1e-3)
    noisy = [_marks(1.5, 0.5), _marks(1.5, 3.0)] * 3  # +0.25 ms, its standard error 0.56
    assert series_last([noisy, noisy]) == 0.0
    assert series_last([[m[:6] for m in reps]] * 2) == 0.0
    assert series_last([[], []]) == 0.0


def _last_gathers(plan) -> int:
    """ZeRO-3 parameter gathers in the first program that a compute follows (allocations and frees aside)."""
    ops = [op for op in plan.programs[0].ops if not isinstance(op, (Alloc, Free))]
    return sum(isinstance(op, Collective) and op.op == "allgather" and op.payload == "params"
               and isinstance(after, Compute) for op, after in zip(ops, ops[1:]))


def test_zero3_gathers_before_a_compute_pay_the_last_calls_extra_exactly():
    """Every ZeRO-3 gather of parameters that a compute follows pays ``series_last`` per ring step, and no
    other call does: the step is longer by it times those gathers' ring steps; the fast path equals the full
    simulation; a profile without it, or a 4-rank topology when it was measured at 2 alone, prices as
    before; ZeRO-2 (parameters kept whole) and DDP are priced the same with it."""
    last, gathers = 2e-4, _last_gathers(_zero3(2)[1])
    assert gathers == 18  # tiny-deep: before each of 9 forwards and 9 backwards
    assert_priced_per_gather("series_last", last, gathers)
