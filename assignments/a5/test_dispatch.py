"""Grader for A5 (all-to-all token dispatch). Run: pytest assignments/a5"""

import pytest
import torch

from simpar.course.adapter import load, solution_spec

SPEC = solution_spec(__file__, "dispatch.py")
solution = load(SPEC)
WORLDS = [2, 3, 4, 8]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", [4096, 1001])
def test_schedule_pairs_every_rank_with_every_other_once(world, nbytes):
    steps = solution.alltoall_schedule(world, nbytes)
    assert len(steps) == world - 1, "a pairwise all-to-all takes N-1 steps"
    base, extra = divmod(nbytes, world)
    sizes = [base + (1 if j < extra else 0) for j in range(world)]
    pairs = []
    for step in steps:
        assert sorted(src for src, _, _ in step) == list(range(world)), "every rank sends once per step"
        assert sorted(dst for _, dst, _ in step) == list(range(world)), "every rank receives once per step"
        for src, dst, size in step:
            assert src != dst, "a rank keeps its own chunk"
            assert size == sizes[dst], "a send carries the chunk for its destination"
            pairs.append((src, dst))
    assert sorted(pairs) == [(s, d) for s in range(world) for d in range(world) if s != d], "every pair once"
    sent = [sum(size for step in steps for src, _, size in step if src == r) for r in range(world)]
    assert sent == [nbytes - sizes[r] for r in range(world)], "each rank sends all but its own chunk"


def test_dispatch_buffer_places_tokens_in_order_and_drops_past_capacity():
    tokens = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    expert = torch.tensor([1, 0, 1, 1, 2, 1, 0, 3])
    buffer, slot = solution.dispatch_buffer(tokens, expert, 4, 2)
    assert tuple(buffer.shape) == (4, 2, 3)
    assert slot.tolist() == [0, 0, 1, -1, 0, -1, 1, 0], "next free slot in token order; -1 past the capacity"
    for t, (e, s) in enumerate(zip(expert.tolist(), slot.tolist())):
        if s >= 0:
            assert torch.equal(buffer[e, s], tokens[t])
    assert buffer[2, 1].abs().sum() == 0 and buffer[3, 1].abs().sum() == 0, "unused slots stay zero"


def test_combine_returns_each_tokens_row_and_zeros_for_dropped():
    outputs = torch.randn(4, 2, 3)
    expert, slot = torch.tensor([1, 0, 1, 1, 3]), torch.tensor([0, 0, 1, -1, 0])
    out = solution.combine(outputs, expert, slot)
    assert torch.equal(out[0], outputs[1, 0]) and torch.equal(out[2], outputs[1, 1])
    assert torch.equal(out[4], outputs[3, 0]) and out[3].abs().sum() == 0


@pytest.mark.parametrize("world, experts", [(2, 4), (4, 8), (4, 4)])
def test_real_dispatch_on_gloo(world, experts):
    from simpar.course.workers import run_dispatch

    capacity, tokens, hidden = 3, 10, 5
    for rank, (x, expert, out, sent, received) in enumerate(run_dispatch(SPEC, world, experts, capacity, tokens,
                                                                         hidden)):
        x, out, seen = torch.tensor(x), torch.tensor(out), [0] * experts
        for t, e in enumerate(expert):
            kept = seen[e] < capacity
            seen[e] += 1
            want = x[t] * (e + 1) if kept else torch.zeros(hidden)
            assert torch.allclose(out[t], want), f"rank {rank} token {t}: expert {e}'s output did not come back"
        per_call = (world - 1) * (experts // world) * capacity * hidden * 4  # (N-1)/N of the whole buffer
        assert sent == received == 2 * per_call, f"rank {rank}: not (N-1)/N of the buffer, twice"
