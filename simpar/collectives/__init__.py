"""Collective operations: pick an algorithm, expand it into phases, run them on a Network.

``OPS`` maps each (op, algorithm) pair to exactly one expansion; ``collective`` is a SimPy process
so several collectives can share a network (and contend) in one simulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import simpy

from simpar.collectives import alltoall, hierarchical, nvls, ring, tree, worker_server
from simpar.collectives.schedule import Phase, Transfer, chunk_sizes, drop_empty, merge_phases
from simpar.costs import nccl
from simpar.engine import Network
from simpar.errors import SimparError
from simpar.topologies.graph import Topology

ALGO_ALIASES = {"worker-server": "ps", "ws": "ps", "parameter-server": "ps", "hier": "hierarchical"}
OP_ALIASES = {"all-reduce": "allreduce", "reduce-scatter": "reducescatter", "all-gather": "allgather",
              "all-to-all": "alltoall", "a2a": "alltoall",
              "sendrecv": "p2p", "send": "p2p"}


@dataclass(frozen=True)
class CollectiveCall:
    """Everything an algorithm may need; each expansion takes the parts it uses."""

    group: list[str]
    nbytes: int
    topology: Topology
    root: int = 0
    peer: int = -1
    itemsize: int = 1  # bytes per element: rings split tensors by elements, as torch does


def _rings(fn):
    """A ring algorithm over all of the group's channel rings (several across machines)."""
    return lambda c: ring.over_channels(fn, ring.channel_orders(c.group, c.topology.machine), c.nbytes,
                                        c.itemsize)


def _p2p(c: CollectiveCall) -> list[Phase]:
    return [Phase("p2p", (Transfer(c.group[c.root], c.group[c.peer], c.nbytes),))]


def _shift(c: CollectiveCall) -> list[Phase]:
    """Every rank sends its buffer to the next one round the group at once (one step of ring attention)."""
    n = len(c.group)
    return drop_empty([Phase("ring shift", tuple(Transfer(c.group[i], c.group[(i + 1) % n], c.nbytes)
                                                 for i in range(n) if n > 1))])


Expansion = Callable[[CollectiveCall], list[Phase]]
OPS: dict[str, dict[str, Expansion]] = {
    "allreduce": {
        "ring": _rings(ring.all_reduce),
        "ps": lambda c: worker_server.all_reduce(c.group, c.nbytes, c.topology.server),
        "tree": lambda c: tree.all_reduce(c.group, c.nbytes),
        "hierarchical": lambda c: hierarchical.all_reduce(c.group, c.nbytes, c.topology),
        "nvls": lambda c: nvls.all_reduce(c.group, c.nbytes, c.topology),
    },
    "reducescatter": {
        "ring": _rings(ring.reduce_scatter),
        "ps": lambda c: worker_server.reduce_scatter(c.group, c.nbytes, c.topology.server),
        "hierarchical": lambda c: hierarchical.reduce_scatter(c.group, c.nbytes, c.topology),
    },
    "allgather": {
        "ring": _rings(ring.all_gather),
        "ps": lambda c: worker_server.all_gather(c.group, c.nbytes, c.topology.server),
        "hierarchical": lambda c: hierarchical.all_gather(c.group, c.nbytes, c.topology),
    },
    "broadcast": {
        "ring": lambda c: ring.broadcast(c.group, c.nbytes, c.root),
        "ps": lambda c: worker_server.broadcast(c.group, c.nbytes, c.root, c.topology.server),
        "tree": lambda c: tree.broadcast(c.group, c.nbytes, c.root),
    },
    "reduce": {
        "ring": lambda c: ring.reduce(c.group, c.nbytes, c.root),
        "ps": lambda c: worker_server.reduce(c.group, c.nbytes, c.root, c.topology.server),
        "tree": lambda c: tree.reduce(c.group, c.nbytes, c.root),
    },
    "alltoall": {
        "pairwise": lambda c: alltoall.pairwise(c.group, c.nbytes, concurrent=c.topology.nccl),
        "hierarchical": lambda c: alltoall.hierarchical(c.group, c.nbytes, c.topology),
    },
    "p2p": {"direct": _p2p},
    "shift": {"ring": _shift},
}
DEFAULT_ALGO = {"p2p": "direct", "alltoall": "pairwise"}

# nccl-tests: busbw = algbw * factor, the per-rank link load an optimal algorithm needs.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
    "shift": lambda n: 1.0,
}


def normalize(op: str, algo: str | None) -> tuple[str, str]:
    """Canonical (op, algo) names, or a clear error naming --op / --algo."""
    op_key = OP_ALIASES.get(op.strip().lower(), op.strip().lower().replace("_", ""))
    if op_key not in OPS:
        raise SimparError(f"--op: unknown collective {op!r}; choose from {', '.join(OPS)}")
    if algo is None:
        algo_key = DEFAULT_ALGO.get(op_key, "ring")
    else:
        algo_key = ALGO_ALIASES.get(algo.strip().lower(), algo.strip().lower())
    if algo_key not in OPS[op_key]:
        raise SimparError(f"--algo: {op_key} has no algorithm {algo!r}; choose from {', '.join(OPS[op_key])}")
    return op_key, algo_key


def expand(op: str, algo: str | None, topology: Topology, group: list[str], nbytes: int,
           root: int = 0, peer: int = -1, itemsize: int = 1) -> list[Phase]:
    op, algo = normalize(op, algo)
    n = len(group)
    if op == "p2p" and n < 2:
        raise SimparError("--gpus: p2p needs at least 2 ranks")
    for flag, value in (("--root", root), ("--peer", peer)):
        if not -n <= value < n:
            raise SimparError(f"{flag}: rank {value} is outside the group of {n} ranks")
    if op == "p2p" and group[root] == group[peer]:
        raise SimparError("--peer: p2p needs two different ranks")
    return OPS[op][algo](CollectiveCall(list(group), int(nbytes), topology, root, peer, itemsize))


def plan_call(op, topology: Topology, groups: list[list[str]]) -> list[Phase]:
    """The phases of a Plan's Collective issued for all ``groups`` (GPU node names) at once, each
    coalesced piece (``op.pieces``) beside the others in one call."""
    return drop_empty(merge_phases(*(expand(op.op, op.algo, topology, g, size, itemsize=op.itemsize)
                                     for g in groups for size in op.pieces or (op.nbytes,))))


@lru_cache(maxsize=2**16)
def _phase_classes(topology: Topology, phase: Phase) -> tuple[str, ...]:
    """The latency class of each transfer's route (asked once per protocol and per call: cached)."""
    return tuple(_latency_class(topology, t.src, t.dst) for t in phase.transfers)


@lru_cache(maxsize=2**20)
def _latency_class(topology: Topology, src: str, dst: str) -> str:
    return nccl.latency_class(topology.route_kinds(src, dst))


def phase_latency(topology: Topology, proto: nccl.Protocol, phase: Phase) -> float:
    """A phase's steps, each at its edges' hardware latency: NCCL's sum over a ring's hops, with
    the share of inter-node edges paying the network's latency."""
    classes = _phase_classes(topology, phase)
    per_step = sum(proto.step_latency[c] for c in classes) / len(classes)
    return max(t.steps for t in phase.transfers) * per_step


def protocol_for(topology: Topology, algo: str, phases: list[Phase]) -> nccl.Protocol | None:
    """NCCL's protocol for this call on a GPU topology, the one its cost model finds fastest: base
    latency + the phases' step latencies + the bytes over the slowest links at the protocol's share
    of the wire (None: a textbook alpha-beta network, where each step pays the route's hop latencies)."""
    if not topology.nccl or not phases:
        return None
    if algo == "nvls":
        return nccl.NVLS
    wire_time = sum(max(t.nbytes / topology.bottleneck(t.src, t.dst) for t in phase.transfers)
                    for phase in phases)
    return min(nccl.PROTOCOLS, key=lambda p: p.base_latency + wire_time / p.wire_fraction
               + sum(phase_latency(topology, p, phase) for phase in phases))


def call_delay(topology: Topology, wakes: bool, handoff: bool = False) -> float:
    """Seconds a call (``handoff``: a pipeline send) pays before its transfers on a calibrated CPU-rank
    topology where it comes right after computing (``wakes``); one that follows another call pays
    nothing more than its steps; a collective's wake grows with the compute before it, which the
    simulator prices per op (``OpCosts.wake``): this is its least, after a short compute."""
    if not wakes:
        return 0.0
    return topology.handoff_latency if handoff else topology.collective_wake(0.0)


def collective(network: Network, phases: list[Phase], tag: str = "", proto: nccl.Protocol | None = None,
               wake: float = 0.0, algo: str | None = None) -> simpy.Process:
    """A SimPy process running the phases one after another, each phase's transfers at once.
    Under an NCCL ``proto`` the call first pays its base latency, each phase its steps' latency;
    otherwise ``wake`` seconds (``OpCosts.wake``: 0 but on calibrated CPU ranks, right after computing; below
    0, taken off its steps' latency, share and share alike, none below 0),
    and a Worker-Server call's legs their measured cost where the topology has it (``Topology.leg_pricing``);
    elsewhere each step its route's latency."""
    topology = network.topology
    step_shift = 0.0
    delay = wake if proto is None else 0.0
    legs = topology.leg_pricing(algo, phases) if proto is None else None
    if delay < 0:  # cheaper than its steps at the step latency (after a short compute): each step pays less
        steps = sum(max((t.steps for t in phase.transfers), default=0) for phase in phases)
        step_shift += delay / steps if steps and not legs else 0.0
        delay = 0.0

    def run():
        if proto is not None and proto.base_latency:
            yield network.env.timeout(proto.base_latency)
        elif delay:
            yield network.env.timeout(delay)
        for phase in phases:
            label = f"{tag}{phase.name}"
            transfers = [(t.src, t.dst, t.nbytes, t.steps) for t in phase.transfers]
            if proto is None:
                yield network.transfer_all(transfers, label, *(legs or ()), step_shift=0.0 if legs else step_shift)
            else:
                yield network.transfer_all(transfers, label, phase_latency(topology, proto, phase),
                                           proto.wire_fraction)

    return network.env.process(run())


def point_to_point(network: Network, transfers: list[tuple], tag: str = "", wakes: bool = False,
                   runnable: int | None = None) -> simpy.Event:
    """Sends between ranks (pipeline stages): one step each, after the topology's ``call_delay``.
    On CPU ranks sharing cores, ``runnable`` (the ranks computing or in this send at that moment)
    picks the step latency and handoff measured with that many ranks in a call: a pipeline's stages
    take turns, so a send rarely meets every rank busy, as the calibration's pattern does."""
    delay, latency = call_delay(network.topology, wakes, handoff=True), None
    measured = network.topology.send_costs(runnable) if runnable is not None else None
    if measured is not None:
        delay, latency = (measured[0] if wakes else 0.0), measured[1]
    if not delay:
        return network.transfer_all(transfers, tag, latency)

    def run():
        yield network.env.timeout(delay)
        yield network.transfer_all(transfers, tag, latency)

    return network.env.process(run())


__all__ = ["ALGO_ALIASES", "BUSBW_FACTOR", "OPS", "Phase", "Transfer", "chunk_sizes",
           "call_delay", "collective", "expand", "normalize", "phase_latency", "point_to_point", "protocol_for"]
