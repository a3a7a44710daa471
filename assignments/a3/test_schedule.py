"""Grader for A3 (1F1B). Run: pytest assignments/a3"""

import pytest

from simpar.course.adapter import load_solution

solution = load_solution(__file__, "schedule.py")
CASES = [(p, m) for p in (1, 2, 4, 8) for m in (1, 2, 4, 8, 16)]


def execute(orders, stages, microbatches, forward=1.0, backward=2.0):
    """Run each stage's order with the pipeline's dependencies (a forward needs the previous
    stage's forward of that micro-batch, a backward the next stage's backward and its own forward).
    Returns (finish time of each pass, makespan); fails on a deadlock."""
    done, position, clock = {}, [0] * stages, [0.0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, mb = orders[s][position[s]]
            needs = [(s, "F", mb)] if kind == "B" else []
            needs += [(s - 1, "F", mb)] if kind == "F" and s > 0 else []
            needs += [(s + 1, "B", mb)] if kind == "B" and s < stages - 1 else []
            if all(n in done for n in needs):
                start = max([clock[s]] + [done[n] for n in needs])
                clock[s] = done[(s, kind, mb)] = start + (forward if kind == "F" else backward)
                position[s] += 1
                progressed = True
        waiting = [orders[s][position[s]] for s in range(stages) if position[s] < len(orders[s])]
        assert progressed, f"deadlock: stages wait forever at {waiting}"
    return done, max(clock)


@pytest.mark.parametrize("stages, microbatches", CASES)
def test_every_pass_once_and_forward_before_backward(stages, microbatches):
    orders = solution.one_f_one_b(stages, microbatches)
    assert len(orders) == stages
    for s, order in enumerate(orders):
        assert sorted(order) == sorted([("F", mb) for mb in range(microbatches)] +
                                       [("B", mb) for mb in range(microbatches)]), f"stage {s}"
        for mb in range(microbatches):
            assert order.index(("F", mb)) < order.index(("B", mb)), f"stage {s}: B{mb} before F{mb}"


@pytest.mark.parametrize("stages, microbatches", CASES)
def test_warm_up_and_memory_bound(stages, microbatches):
    """Stage s runs p - s - 1 warm-up forwards and one more before its first backward, and so
    holds at most p - s micro-batches of activations (GPipe would hold m)."""
    for s, order in enumerate(solution.one_f_one_b(stages, microbatches)):
        first_backward = next(i for i, (kind, _) in enumerate(order) if kind == "B")
        assert first_backward == min(stages - s, microbatches), f"stage {s}: {first_backward} forwards first"
        in_flight, most = 0, 0
        for kind, _ in order:
            in_flight += 1 if kind == "F" else -1
            most = max(most, in_flight)
        assert most == min(stages - s, microbatches), f"stage {s} holds {most} micro-batches at once"


@pytest.mark.parametrize("stages, microbatches", CASES)
def test_runs_without_deadlock_and_the_bubble_is_p_minus_1(stages, microbatches):
    """With equal stages, forward 1 and backward 2: (m + p - 1) * 3, a bubble of (p-1)/(m+p-1)."""
    orders = solution.one_f_one_b(stages, microbatches)
    _, makespan = execute(orders, stages, microbatches)
    assert makespan == pytest.approx((microbatches + stages - 1) * 3.0)
    busy = microbatches * 3.0
    assert 1 - busy / makespan == pytest.approx((stages - 1) / (microbatches + stages - 1))


def test_backwards_in_micro_batch_order():
    for order in solution.one_f_one_b(4, 8):
        assert [mb for kind, mb in order if kind == "B"] == list(range(8))
        assert [mb for kind, mb in order if kind == "F"] == list(range(8))
