"""Grader for A6 (ZB-H1). Run: pytest assignments/a6"""

import pytest

from simpar.course.adapter import load_solution

solution = load_solution(__file__, "zb_h1.py")
CASES = [(p, m) for p in (1, 2, 4, 8) for m in (1, 2, 4, 8, 16)]
TIMES = [{"F": 1.0, "B": 1.0, "W": 1.0}, {"F": 2.0, "B": 2.0, "W": 1.0}, {"F": 1.0, "B": 2.0, "W": 1.0},
         {"F": 3.0, "B": 4.0, "W": 2.0}]  # T_W <= T_F, T_B: where ZB-H1's bubble is (p-1)(T_F + T_B - T_W)


def execute(orders, stages, times):
    """Run each stage's order with the pipeline's dependencies (F needs the previous stage's F of that
    micro-batch; B the next stage's B and its own F; W its own B). Returns each stage's finishing time;
    fails on a deadlock."""
    done, position, clock = {}, [0] * stages, [0.0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, mb = orders[s][position[s]]
            needs = {"F": [(s - 1, "F", mb)] if s > 0 else [],
                     "B": [(s, "F", mb)] + ([(s + 1, "B", mb)] if s < stages - 1 else []),
                     "W": [(s, "B", mb)]}[kind]
            if all(n in done for n in needs):
                start = max([clock[s]] + [done[n] for n in needs])
                clock[s] = done[(s, kind, mb)] = start + times[kind]
                position[s] += 1
                progressed = True
        waiting = [orders[s][position[s]] for s in range(stages) if position[s] < len(orders[s])]
        assert progressed, f"deadlock: stages wait forever at {waiting}"
    return clock


@pytest.mark.parametrize("stages, microbatches", CASES)
def test_every_pass_once_in_dependency_and_micro_batch_order(stages, microbatches):
    orders = solution.zb_h1(stages, microbatches)
    assert len(orders) == stages
    for s, order in enumerate(orders):
        assert sorted(order) == sorted((kind, mb) for kind in "FBW" for mb in range(microbatches)), f"stage {s}"
        for mb in range(microbatches):
            assert order.index(("F", mb)) < order.index(("B", mb)) < order.index(("W", mb)), f"stage {s} mb {mb}"
        for kind in "FBW":
            assert [mb for k, mb in order if k == kind] == list(range(microbatches)), f"stage {s}: {kind} order"


def _most_open(order, opens, closes):
    held, most = 0, 0
    for kind, _ in order:
        held += (kind == opens) - (kind == closes)
        most = max(most, held)
    return most


@pytest.mark.parametrize("stages, microbatches", CASES)
def test_warm_up_and_memory_as_1f1b(stages, microbatches):
    """1F1B's warm-up; activations of at most p - s micro-batches wait for their B, and no more than p (1F1B's
    peak, on stage 0) for their W."""
    for s, order in enumerate(solution.zb_h1(stages, microbatches)):
        first_b = next(i for i, (kind, _) in enumerate(order) if kind == "B")
        assert first_b == min(stages - s, microbatches), f"stage {s}: {first_b} forwards before the first B"
        assert _most_open(order, "F", "B") == min(stages - s, microbatches), f"stage {s}: too many awaiting B"
        assert _most_open(order, "F", "W") <= min(stages, microbatches), f"stage {s}: too many awaiting W"


@pytest.mark.parametrize("times", TIMES, ids=lambda t: "F{F:g}-B{B:g}-W{W:g}".format(**t))
@pytest.mark.parametrize("stages, microbatches", CASES)
def test_no_deadlock_and_the_bubble(stages, microbatches, times):
    """Every stage idles (p-1)(T_F + T_B - T_W) once m >= p; never longer than 1F1B's (p-1)(T_F + T_B + T_W)."""
    clock = execute(solution.zb_h1(stages, microbatches), stages, times)
    busy = microbatches * sum(times.values())
    makespan = max(clock)
    one_f_one_b = (stages - 1) * sum(times.values())
    assert makespan - busy <= one_f_one_b + 1e-9, f"idles {makespan - busy}, more than 1F1B's {one_f_one_b}"
    if microbatches >= stages:
        expected = (stages - 1) * (times["F"] + times["B"] - times["W"])
        assert makespan - busy == pytest.approx(expected), f"each stage idles {makespan - busy}, not {expected}"
