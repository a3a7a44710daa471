"""Grader for A1 (ring all-reduce). Run: pytest assignments/a1"""

import pytest

from simpar import topologies
from simpar.collectives import collective
from simpar.collectives.schedule import Phase, Transfer
from simpar.course.adapter import load, solution_spec
from simpar.engine import Network

SPEC = solution_spec(__file__, "ring.py")
solution = load(SPEC)
WORLDS = [2, 3, 4, 8]


def chunk_sizes(nbytes, world):
    base, extra = divmod(nbytes, world)
    return [base + (1 if i < extra else 0) for i in range(world)]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("nbytes", [4096, 1000])
def test_schedule_shape(world, nbytes):
    steps = solution.ring_allreduce_schedule(world, nbytes)
    assert len(steps) == 2 * (world - 1), "a ring all-reduce takes 2(N-1) steps"
    sizes = chunk_sizes(nbytes, world)
    for step in steps:
        assert sorted(src for src, _, _, _ in step) == list(range(world)), "every rank sends once per step"
        for src, dst, chunk, size in step:
            assert dst == (src + 1) % world, "rank i sends only to its right neighbour i+1"
            assert 0 <= chunk < world and size == sizes[chunk], "a send carries one whole chunk"


@pytest.mark.parametrize("world", WORLDS)
def test_schedule_reduces_everything_everywhere(world):
    """Follow the data: which ranks' contributions each rank holds for each chunk. A
    reduce-scatter send adds the sender's partial sum to the receiver's; an all-gather send
    hands over a finished sum."""
    holds = [[{rank} for _ in range(world)] for rank in range(world)]
    everyone = set(range(world))
    for step in solution.ring_allreduce_schedule(world, 64 * world):
        before = [[set(c) for c in rank] for rank in holds]
        for src, dst, chunk, _ in step:
            sent = before[src][chunk]
            if sent == everyone:
                holds[dst][chunk] = set(everyone)  # a finished chunk replaces
            else:
                assert not (sent & before[dst][chunk]), f"chunk {chunk}: rank {dst} would count a rank twice"
                holds[dst][chunk] = before[dst][chunk] | sent
    for rank in range(world):
        for chunk in range(world):
            missing = everyone - holds[rank][chunk]
            assert not missing, f"rank {rank} chunk {chunk} lacks the contributions of ranks {missing}"


@pytest.mark.parametrize("world", WORLDS)
def test_bytes_per_rank_are_optimal(world):
    nbytes = 1200 * world
    sent = [0] * world
    for step in solution.ring_allreduce_schedule(world, nbytes):
        for src, _, _, size in step:
            sent[src] += size
    assert sent == [2 * (world - 1) * nbytes // world] * world, "each rank sends 2(N-1)/N of the data"


@pytest.mark.parametrize("world", [2, 4, 8])
def test_simulated_time_matches_the_ring_formula(world):
    """On a ring of links with latency a and bandwidth B: 2(N-1)a + 2(N-1)/N * S/B."""
    nbytes, bandwidth, latency = 8 * 2**20, 100e9, 5e-6
    topology = topologies.build("ring", world, bandwidth, latency)
    gpus = topology.gpus
    phases = [Phase(f"step {k}", tuple(Transfer(gpus[src], gpus[dst], size) for src, dst, _, size in step))
              for k, step in enumerate(solution.ring_allreduce_schedule(world, nbytes))]
    import simpy

    env = simpy.Environment()
    network = Network(env, topology)
    collective(network, phases)  # starts its own SimPy process
    env.run()
    expected = 2 * (world - 1) * latency + 2 * (world - 1) / world * nbytes / bandwidth
    assert env.now == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_real_allreduce_on_gloo(world):
    from simpar.course.workers import run_ring_allreduce

    numel = 12 * 5  # divisible by 2, 3 and 4
    results = run_ring_allreduce(SPEC, world, numel)
    expected = sum(range(1, world + 1)) * 1.0
    for rank, (values, sent, received) in enumerate(results):
        assert values == [expected + world * i for i in range(numel)], f"rank {rank}: wrong sum"
        assert sent == received == 2 * (world - 1) * numel * 4 // world, f"rank {rank}: not 2(N-1)/N of the bytes"


def test_real_allreduce_uneven_length():
    from simpar.course.workers import run_ring_allreduce

    results = run_ring_allreduce(SPEC, 3, 7)
    for values, _, _ in results:
        assert values == [6.0 + 3 * i for i in range(7)]
