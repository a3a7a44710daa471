import pytest
import simpy

from simpar import SimparError, topologies
from simpar.collective_run import simulate_collective
from simpar.collectives import collective, expand, protocol_for
from simpar.costs import nccl
from simpar.collectives.tree import inorder_edges
from simpar.engine import Network

S = 10**9
B, ALPHA = 100e9, 5e-6


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_ring_allreduce_matches_the_alpha_beta_formula(n):
    topo = topologies.build("ring", n, bandwidth=B, latency=ALPHA)
    result = simulate_collective(topo, "allreduce", "ring", S)
    formula = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / B
    assert result.time_s == pytest.approx(formula, rel=0.01)
    for rank in result.ranks:
        assert rank["bytes_sent"] == rank["bytes_received"] == 2 * (n - 1) * S // n
    assert result.busbw_Bps == pytest.approx(result.algbw_Bps * 2 * (n - 1) / n)


@pytest.mark.parametrize("op, factor", [("reducescatter", 1), ("allgather", 1)])
def test_ring_halves_move_n_minus_1_over_n(op, factor):
    n = 8
    result = simulate_collective(topologies.build("ring", n, bandwidth=B, latency=ALPHA), op, "ring", S)
    assert all(r["bytes_sent"] == (n - 1) * S // n for r in result.ranks)
    assert result.time_s == pytest.approx((n - 1) * ALPHA + (n - 1) / n * S / B)


def test_uneven_chunks_keep_whole_bytes_per_rank():
    n, size = 4, 10**6 + 3  # chunks of 250001, 250001, 250001, 250000
    result = simulate_collective(topologies.build("ring", n), "reducescatter", "ring", size)
    # rank i sends every chunk but its own (chunk i)
    assert [r["bytes_sent"] for r in result.ranks] == [size - 250001] * 3 + [size - 250000]


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_worker_server_traffic_on_star(n):
    result = simulate_collective(topologies.build("star", n, bandwidth=10e9, latency=1e-6), "allreduce", "ps", S)
    assert all(r["bytes_sent"] == r["bytes_received"] == S for r in result.ranks)
    assert result.server == {"bytes_sent": n * S, "bytes_received": n * S}


def test_worker_server_falls_behind_ring_as_n_grows():
    ratios = []
    for n in (2, 4, 8, 16, 32):
        topo = topologies.build("star", n, bandwidth=10e9, latency=1e-6)
        ws = simulate_collective(topo, "allreduce", "ps", S).time_s
        ring = simulate_collective(topo, "allreduce", "ring", S).time_s
        ratios.append(ws / ring)
    assert ratios == sorted(ratios) and ratios[-1] > 8 * ratios[0]
    # the server's link carries N*S each way; a ring rank 2(N-1)/N*S: ratio -> N^2/(N-1)
    assert ratios[-1] == pytest.approx(32 * 32 / 31, rel=0.01)


def test_worker_server_without_a_dedicated_server_uses_rank_0():
    result = simulate_collective(topologies.build("pcie", 4), "allreduce", "ps", S)
    assert result.ranks[0] == {"rank": 0, "bytes_sent": 3 * S, "bytes_received": 3 * S}
    assert result.server is None


def test_two_collectives_sharing_links_take_longer_as_fair_sharing_predicts():
    n = 8
    topo = topologies.build("ring", n, bandwidth=B, latency=ALPHA)
    phases = expand("allreduce", "ring", topo, topo.gpus, S)
    alone = simulate_collective(topo, "allreduce", "ring", S).time_s
    env = simpy.Environment()
    net = Network(env, topo)
    first, second = collective(net, phases, "a: "), collective(net, phases, "b: ")
    env.run()
    latency, bandwidth = 2 * (n - 1) * ALPHA, 2 * (n - 1) / n * S / B
    assert alone == pytest.approx(latency + bandwidth)
    assert env.now == pytest.approx(latency + 2 * bandwidth)  # each gets half of every link
    assert first.value is None and second.value is None and first.processed and second.processed


def test_disjoint_collectives_do_not_contend():
    topo = topologies.build("dgx-a100", 16)
    node0, node1 = topo.gpus[:8], topo.gpus[8:]
    alone = simulate_collective(topologies.build("dgx-a100", 8), "allreduce", "ring", S).time_s
    env = simpy.Environment()
    net = Network(env, topo)
    for group in (node0, node1):
        phases = expand("allreduce", "ring", topo, group, S)
        collective(net, phases, proto=protocol_for(topo, "ring", phases))
    env.run()
    assert env.now == pytest.approx(alone)


def test_hierarchical_sends_less_over_the_network_than_a_flat_ring():
    topo = topologies.build("dgx-a100", 64)
    flat = simulate_collective(topo, "allreduce", "ring", 2**30)
    hier = simulate_collective(topo, "allreduce", "hierarchical", 2**30)
    ib = lambda r: sum(l["bytes"] for l in r.links if l["kind"] == "ib")
    assert ib(hier) < ib(flat)
    n, local = 64, 8  # per rank: intra RS + inter AR on 1/8 + intra AG
    expected = 2 * (local - 1) * 2**30 // local + 2 * (n // local - 1) * (2**30 // local) // (n // local)
    assert all(r["bytes_sent"] == expected for r in hier.ranks)


def test_multi_node_ring_uses_every_nic():
    result = simulate_collective(topologies.build("dgx-a100", 32), "allreduce", "ring", 2**30)
    nics = {l["name"].split("->")[0] for l in result.links if l["kind"] == "ib" and ".nic" in l["name"].split("->")[0]}
    assert len(nics) == 32


def test_double_binary_tree_balances_traffic_with_log_depth():
    n = 15
    result = simulate_collective(topologies.build("ring", n, bandwidth=B, latency=ALPHA), "allreduce", "tree", S)
    # two trees of n-1 edges, each edge carrying S/2 up and S/2 down
    assert sum(r["bytes_sent"] for r in result.ranks) == 2 * (n - 1) * S
    # an inner node sends S/2 up and S/2 to each of two children, a leaf only S/2 up; a rank
    # inner in both trees would send 3S, so <= 2S shows the trees complement each other
    assert max(r["bytes_sent"] for r in result.ranks) <= 2 * S
    assert inorder_edges(n)[1] == 3 and len(inorder_edges(n)[0]) == n - 1


@pytest.mark.parametrize("op, algo", [("broadcast", "ring"), ("broadcast", "tree"), ("broadcast", "ps"),
                                      ("reduce", "ring"), ("reduce", "tree"), ("reduce", "ps")])
def test_rooted_collectives_reach_every_rank(op, algo):
    n = 8
    result = simulate_collective(topologies.build("pcie", n), op, algo, S, root=3)
    moved = "bytes_received" if op == "broadcast" else "bytes_sent"
    assert all(r[moved] == S for r in result.ranks if r["rank"] != 3)
    assert result.busbw_Bps == result.algbw_Bps


def test_p2p_moves_bytes_between_two_ranks_only():
    result = simulate_collective(topologies.build("nvlink-full", 4), "p2p", None, S, root=1, peer=2)
    assert [(r["bytes_sent"], r["bytes_received"]) for r in result.ranks] == [(0, 0), (S, 0), (0, S), (0, 0)]
    # NCCL on GPUs: Simple protocol's base and NVLink step latency, NVLink3 at its achieved fraction
    simple = nccl.protocol("Simple")
    assert result.protocol == "Simple"
    assert result.time_s == pytest.approx(simple.base_latency + simple.step_latency["nvlink"]
                                          + S / (100e9 * nccl.LINK_EFFICIENCY["nvlink3"]))


@pytest.mark.parametrize("op, algo, message", [
    ("gossip", "ring", "--op: unknown collective"),
    ("alltoall", "ring", "--algo: alltoall has no algorithm 'ring'"),
    ("allreduce", "magic", "--algo: allreduce has no algorithm 'magic'"),
    ("allgather", "tree", "--algo: allgather has no algorithm 'tree'"),
])
def test_unknown_op_or_algorithm(op, algo, message):
    topo = topologies.build("ring", 4)
    with pytest.raises(SimparError, match=message):
        expand(op, algo, topo, topo.gpus, S)


def test_alltoall_pairwise_and_hierarchical_move_the_same_bytes_across_nodes():
    """Each rank sends (n-1)/n of its buffer pairwise; the hierarchical one forwards inside the node first, so
    the same bytes cross the network in one message per other node instead of one per remote rank."""
    topo = topologies.build("dgx-a100", 32)
    nbytes = 32 * 2**20
    crossing = {}
    for algo in ("pairwise", "hierarchical"):
        phases = expand("alltoall", algo, topo, topo.gpus, nbytes)
        remote = [t for p in phases for t in p.transfers if topo.machine(t.src) != topo.machine(t.dst)]
        crossing[algo] = (sum(t.nbytes for t in remote), len(remote))
        if algo == "pairwise":  # NCCL posts every peer at once: one phase (gloo's lock-step: test below)
            assert len(phases) == 1
            assert all(sum(t.nbytes for p in phases for t in p.transfers if t.src == g) == nbytes * 31 // 32
                       for g in topo.gpus)
    assert crossing["pairwise"][0] == crossing["hierarchical"][0] == 32 * nbytes * 24 // 32
    assert crossing["hierarchical"][1] == 32 * 3 < crossing["pairwise"][1] == 32 * 24


def test_pairwise_alltoall_runs_its_steps_in_turn_off_nccl():
    topo = topologies.build("ring", 4)
    phases = expand("alltoall", "pairwise", topo, topo.gpus, 4000)
    assert [sorted((t.src, t.dst) for t in p.transfers) for p in phases] == [
        sorted((topo.gpus[i], topo.gpus[(i + k) % 4]) for i in range(4)) for k in (1, 2, 3)]
    assert all(t.nbytes == 1000 for p in phases for t in p.transfers)


def test_hierarchical_needs_equal_ranks_per_machine():
    topo = topologies.build("dgx-a100", 16)
    with pytest.raises(SimparError, match="same number of ranks on every machine"):
        expand("allreduce", "hierarchical", topo, topo.gpus[:12], S)
