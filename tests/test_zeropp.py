"""ZeRO++ and hybrid sharding move the paper's fractions of ZeRO-3's bytes, and cross nodes where they say."""

import pytest

from simpar.collectives import expand
from simpar.models import model
from simpar.plan import Alloc, Collective
from simpar.scenario import make_scenario
from simpar.sim import build_topology, simulate
from simpar.strategies import build_plan
from simpar.strategies.quantize import BLOCK, collective_bytes

GPUS = 16  # two DGX-A100 nodes of 8


def _calls(scenario):
    plan = build_plan(scenario)
    calls = [op for op in plan.programs[0].ops if isinstance(op, Collective)]
    return plan, calls


def _cross_node_bytes(scenario, plan, call) -> int:
    """Bytes rank 0's groups send from one node to another in this call."""
    topology = build_topology(scenario)
    total = 0
    for group in plan.groups(plan.programs[0], call.group):
        names = [topology.gpus[r] for r in group]
        for phase in expand(call.op, call.algo, topology, names, call.nbytes, itemsize=call.itemsize):
            total += sum(t.nbytes for t in phase.transfers if topology.machine(t.src) != topology.machine(t.dst))
    return total


def _scenario(**options):
    return make_scenario(model("gpt2-medium"), options.pop("strategy", "zero3"), GPUS, gather_granularity="layer"
                         if not any(k.startswith("zeropp") for k in options) else None, **options)


def test_qwz_halves_the_forward_gather():
    base = [c for c in _calls(_scenario())[1] if c.op == "allgather"]
    qwz = [c for c in _calls(_scenario(zeropp_qwz=True))[1] if c.op == "allgather"]
    assert len(base) == len(qwz)
    for b, q in zip(base, qwz):
        numel = b.nbytes // 2
        assert q.nbytes == collective_bytes(numel, GPUS, "int8")  # int8 values and an fp32 scale a block
        assert numel <= q.nbytes <= numel * (1 + 4 / BLOCK) + 4 * GPUS
        if numel > 10**6:  # (a final norm's few thousand are mostly scales)
            assert q.nbytes / b.nbytes == pytest.approx(0.5, rel=0.01)


def test_hpz_keeps_the_backward_gather_inside_the_node_and_holds_a_secondary_partition():
    scenario = _scenario(zeropp_hpz=8)
    plan, calls = _calls(scenario)
    gathers = [c for c in calls if c.op == "allgather"]
    backward = gathers[len(gathers) // 2:]
    assert all(c.group == "shard" for c in backward) and all(c.group == "dp" for c in gathers[:len(gathers) // 2])
    assert all(_cross_node_bytes(scenario, plan, c) == 0 for c in backward)
    assert all(_cross_node_bytes(scenario, plan, c) > 0 for c in gathers[:2])
    secondary = [op for op in plan.programs[0].ops if isinstance(op, Alloc) and "secondary" in op.payload]
    assert secondary[0].nbytes == int(2 * scenario.model.params / 8)


def test_qgz_reduces_a_quarter_of_the_gradient_bytes():
    base = [c for c in _calls(_scenario())[1] if c.op == "reducescatter"]
    qgz = [c for c in _calls(_scenario(zeropp_qgz=True))[1] if c.op == "reducescatter"]
    for b, q in zip(base, qgz):
        assert q.nbytes == collective_bytes(b.nbytes // 2, GPUS, "int4") and q.algo == "hierarchical"
        if b.nbytes > 10**6:
            assert q.nbytes / b.nbytes == pytest.approx(0.25, rel=0.02)


def test_zeropp_cuts_zero3s_cross_node_bytes():
    def cross(scenario):
        plan, calls = _calls(scenario)
        return sum(_cross_node_bytes(scenario, plan, c) for c in calls)
    base, plus = cross(_scenario()), cross(_scenario(zeropp_qwz=True, zeropp_hpz=8, zeropp_qgz=True))
    # qwZ halves the forward gather, hpZ removes the backward one, qgZ quarters the gradients and keeps
    # three quarters of them inside the node: well under a quarter of ZeRO-3's bytes cross nodes
    assert plus < base / 4


def test_hsdp_crosses_nodes_with_an_all_reduce_of_the_nodes_shard_only():
    scenario = _scenario(strategy="hsdp")
    plan, calls = _calls(scenario)
    assert plan.grid.shard == 8 and plan.grid.replica == 2
    for call in calls:
        crossing = _cross_node_bytes(scenario, plan, call)
        if call.group == "replica":
            assert call.op == "allreduce"
            # each unit's gradient shard (1/8 of it) all-reduced between the M = 2 nodes: every rank sends
            # 2 x (M - 1)/M of it to the other node
            assert call.nbytes == 2 * -(-scenario.model.unit_params(call.units[0]) // 8)
            assert crossing / GPUS == 2 * (2 - 1) / 2 * call.nbytes
        else:
            assert crossing == 0


def test_hsdp_memory_is_zero3s_over_the_shard():
    zero3 = simulate(_scenario(), check_oom=False).ranks[0]["memory"]
    hsdp = simulate(_scenario(strategy="hsdp"), check_oom=False).ranks[0]["memory"]
    assert hsdp["optimizer"] == pytest.approx(zero3["optimizer"] * GPUS / 8, rel=1e-6)
