"""A topology: devices and switches joined by full-duplex links, with routing.

Each physical link is two *channels*, one per direction, each with its own bandwidth (a half-duplex
link is one channel both directions share); the simulator shares channels between the transfers
crossing them. Routes are least-cost paths
(latency plus the time to move 1 MiB) that never pass *through* a GPU, host memory or a server
(those only send and receive; a topology may let GPUs forward, as a plain ring network does), and
never through a third machine: between two machines, only shared fabric nodes (machine ``None``,
e.g. InfiniBand switches) are crossed. The second rule also keeps routing fast at thousands of GPUs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx
import numpy as np

from simpar.errors import SimparError

# Node kinds that may only be a route's first or last hop.
ENDPOINT_KINDS = frozenset({"gpu", "host", "nvme", "server"})
_COST_PROBE_BYTES = 2**20
_FOREIGN_NIC_PENALTY = 1e-9  # only breaks ties between equally fast NICs


@dataclass(frozen=True)
class Link:
    """A full-duplex link. ``bandwidth`` is per direction; ``reverse_bandwidth`` defaults to it.
    ``half_duplex``: one ``bandwidth`` shared by both directions (a CPU rank's end of a loopback
    connection, whose core copies what it sends and what it receives)."""

    kind: str  # nvlink, pcie, ib, eth, membus, wire
    bandwidth: float  # bytes/s from the first endpoint to the second
    latency: float  # seconds per hop
    reverse_bandwidth: float | None = None
    efficiency: float = 1.0  # achieved fraction of the wire rate (costs/nccl.py LINK_EFFICIENCY)
    half_duplex: bool = False

    def rate(self, forward: bool) -> float:
        if forward or self.reverse_bandwidth is None:
            return self.bandwidth
        return self.reverse_bandwidth


class Topology:
    """Nodes (GPUs, switches, NICs, hosts...) and links, plus the rank order of the GPUs."""

    def __init__(self, name: str, description: str = "", gpus_forward: bool = False, nccl: bool = False,
                 nvls: bool = False):
        self.name = name
        # GPUs talking through NCCL: collectives pay its protocols' latencies (costs/nccl.py); False for
        # the textbook alpha-beta networks (ring, star) and the CPU ranks of the executor
        self.nccl = nccl
        self.nvls = nvls  # NVSwitches that reduce in the switch (NVLink SHARP, H100)
        self.gpus_forward = gpus_forward  # GPUs may relay traffic (a ring network of routers)
        # seconds a collective or send right after computing pays before its steps: the executor's gloo ranks
        # waiting for a peer still computing and waking from a blocked receive (a calibrated profile's wake)
        self.wake_latency = 0.0
        # ... and what a call pays more after a longer compute (the ranks drift apart): (seconds of compute, seconds
        # beyond the wake), the first at wake_phase, the compute the wake was measured after; between, interpolated;
        # beyond the last, on at its last piece's slope (None: nothing more)
        self.wake_phase = 0.0
        self.wake_curve: tuple[tuple[float, ...], tuple[float, ...]] | None = None
        # ((seconds of a short compute, what a call after it pays beyond its steps; negative: less), ...): below
        # wake_phase the wake is interpolated through (0, wake_anchor), these and (wake_phase, the wake), as a
        # share of the algorithm's wake; None: paid whole
        self.wake_short: tuple[tuple[float, float], ...] | None = None
        # what a call right after a zero-length compute pays beyond its steps at the step latency (wake_short's
        # first point, 0 elsewhere): the back-to-back pace against the in-step one, at the short loops' size
        # (negative: the step latency is fitted on a series after a unit's compute, whose stalls such a call has not)
        self.wake_anchor = 0.0
        self.handoff_latency = 0.0  # the same for a pipeline send: it waits for one neighbour, not a group
        # seconds a compute right after a collective, send or receive pays: a rank resuming after a blocked
        # receive computes slower for a while (a calibrated profile's resume; 0 elsewhere)
        self.resume_latency = 0.0
        self.resume_after_recv_latency = 0.0  # the same right after a pipeline receive (stages take turns)
        # seconds a ring call's steps after its first pay, together, beyond their price when the call comes after a
        # compute of at least wake_phase, for the phase loops' all-reduce; a call of fewer steps its share
        # (calibrate/lag.py's later_steps); 0: none
        self.later_steps = 0.0
        # (seconds per parameter tensor, per parameter) the executor spends handling the data of a data-parallel
        # collective (flattening the units' tensors, scaling, re-pointing each): Python on the rank's core
        self.tensor_work = (0.0, 0.0)
        # the same for ZeRO's ops that handle their data otherwise: "gather", an all-gather of parameters held
        # whole (a copy into each, nothing concatenated); a kind not here is handled as tensor_work (a
        # calibrated profile's sharded_work); and "accumulate", what a backward adds a micro-batch's gradients
        # into those an earlier one left with (sim/accumulation.py; none where it is not here)
        self.sharded_work: dict[str, tuple[float, float]] = {}
        # CPU rank processes sharing a machine's cores: ranks computing at once -> how much slower each
        # computes (max(1, k / cores): sim/cores.py); None: every device computes on its own
        self.core_slowdown: dict[int, float] | None = None
        # with core_slowdown: ranks runnable at once -> a pipeline send's step latency and wake, as measured
        # with that many ranks in a call (a calibrated profile's ring and handoff by world size); a send
        # waits for a core as long as the ranks computing or calling at that moment make it wait
        self.step_latency_by_ranks: dict[int, float] | None = None
        self.handoff_by_ranks: dict[int, float] | None = None
        # seconds a pipeline receive posted after its send was issued takes from its posting, by ranks runnable
        # as above: gloo moves a message only once both ends have posted it (a rendezvous), so a late receive
        # waits for the round trip through the sender's gloo thread, which shares a core with its compute (a
        # calibrated profile's late_recv; None elsewhere: a receive waits for the data to land, no longer)
        self.late_recv_by_ranks: dict[int, float] | None = None
        # the executor's Worker-Server all-reduce as measured in the step's pattern (a calibrated profile's
        # worker_server): its wake after computing, in place of wake_latency, and (seconds, bytes/s) of each
        # one-way leg as the server takes them in turn; None: its legs priced through the links as a ring's step
        # (at 4 ranks on 2 cores a leg wakes two ranks where a ring step waits for all four to be scheduled)
        self.worker_server_wake: float | None = None
        self.worker_server_leg: tuple[float, float] | None = None
        # a message's latency is work its two ends do (half each) on their links' capacity, shared with the other
        # messages they send and receive at once, not a delay: the executor's gloo ranks on a CPU, where a ring
        # step (a rank sending and receiving) costs about twice a one-way message (engine.Network.transfer_all)
        self.latency_as_work = False
        self.description = description
        self.graph = nx.Graph()
        self.gpus: list[str] = []  # index = rank
        self.server: str | None = None  # dedicated Worker-Server node, if the topology has one
        self._channels: list[tuple[str, str]] = []
        self._channel_ids: dict[tuple[str, str], int] = {}
        self._forward: list[bool] = []  # whether a channel runs its link's way (a half-duplex one: both)
        self._half_duplex: list[bool] = []
        self._capacity: list[float] = []
        self._latency: list[float] = []
        self._kind: list[str] = []
        self._adjacency_index: dict[str, dict] | None = None
        self.route = lru_cache(maxsize=None)(self._route)
        self.route_latency = lru_cache(maxsize=None)(self._route_latency)
        self.bottleneck = lru_cache(maxsize=None)(self._bottleneck)
        self.route_array = lru_cache(maxsize=None)(self._route_array)  # read-only: shared by every flow

    # -- building -------------------------------------------------------------------------
    def add_node(self, name: str, kind: str, machine: int | None = 0, spec=None,
                 affinity: frozenset | None = None) -> str:
        """``machine`` is the box the node sits in (None: shared fabric between boxes).
        ``affinity`` names the GPUs a NIC serves (a set): routes prefer a GPU's own NIC (as NCCL does)."""
        if name in self.graph:
            raise ValueError(f"duplicate node {name}")
        self.graph.add_node(name, kind=kind, machine=machine, spec=spec, affinity=affinity)
        if kind == "gpu":
            self.gpus.append(name)
        elif kind == "server":
            self.server = name
        return name

    def connect(self, a: str, b: str, link: Link) -> None:
        cost = link.latency + _COST_PROBE_BYTES / min(link.rate(True), link.rate(False))
        self.graph.add_edge(a, b, link=link, cost=cost)
        self._adjacency_index = None
        for src, dst, forward in ((a, b, True), (b, a, False)):
            if link.half_duplex and not forward:  # the reverse way is the same channel
                self._channel_ids[(src, dst)] = self._channel_ids[(dst, src)]
                continue
            self._channel_ids[(src, dst)] = len(self._channels)
            self._channels.append((src, dst))
            self._capacity.append(link.rate(forward) * link.efficiency)
            self._latency.append(link.latency)
            self._kind.append(link.kind)
            self._forward.append(forward)
            self._half_duplex.append(link.half_duplex)

    def set_efficiency(self, kind: str, efficiency_of_rate) -> None:
        """Give every link of ``kind`` the achieved fraction ``efficiency_of_rate(its forward rate)``
        (a measured bus bandwidth over each link's wire rate: simpar calibrate)."""
        for a, b, data in self.graph.edges(data=True):
            link = data["link"]
            if link.kind != kind:
                continue
            data["link"] = link = Link(link.kind, link.bandwidth, link.latency, link.reverse_bandwidth,
                                       efficiency_of_rate(link.rate(True)), link.half_duplex)
            for channel in {self._channel_ids[(a, b)], self._channel_ids[(b, a)]}:
                self._capacity[channel] = link.rate(self._forward[channel]) * link.efficiency
        self.bottleneck.cache_clear()

    # -- queries --------------------------------------------------------------------------
    def collective_wake(self, phase: float, algo: str | None = None) -> float:
        """Seconds a collective (of algorithm ``algo``) pays before its steps when it comes after ``phase``
        seconds of compute: the wake measured for its algorithm, and the wait for the slowest rank's growth."""
        wake = self.worker_server_wake if algo == "ps" and self.worker_server_wake is not None else self.wake_latency
        return wake * self.wake_share(phase) + self.wake_rise(phase)

    def wake_rise(self, phase: float) -> float:
        """What a call pays after ``phase`` seconds of compute beyond the wake after ``wake_phase``: the measured
        curve (``wake_curve``); 0 below it and without it."""
        if self.wake_curve is None:
            return 0.0
        phases, extras = self.wake_curve
        if phase <= phases[-1] or len(phases) < 2:
            return float(np.interp(phase, phases, extras))
        slope = (extras[-1] - extras[-2]) / (phases[-1] - phases[-2]) if phases[-1] > phases[-2] else 0.0
        return extras[-1] + max(slope, 0.0) * (phase - phases[-1])

    def wake_share(self, phase: float) -> float:
        """The share of the wake a call pays after ``phase`` seconds of compute: all of it from the compute it
        was measured after (``wake_phase``) on; below, through what short computes' calls paid beyond their
        steps (``wake_short``, each point; below 0 where it cost less than its steps at the step latency in a
        step), from what a call after no compute pays (``wake_anchor``: the back-to-back pace). 1 without them."""
        if not self.wake_short or phase >= self.wake_phase or not self.wake_latency:
            return 1.0
        # the points between (more ranks than cores can stretch a short compute past the unit's)
        points = sorted((short, min(paid / self.wake_latency, 1.0)) for short, paid in self.wake_short
                        if 0.0 < short < self.wake_phase)
        phases = [0.0] + [short for short, _ in points] + [self.wake_phase]
        start = min(self.wake_anchor / self.wake_latency, 1.0)
        return float(np.interp(phase, phases, [start] + [share for _, share in points] + [1.0]))

    def leg_pricing(self, algo: str | None, phases) -> tuple[float, float] | None:
        """(latency, wire fraction) for ``Network.transfer_all`` that price each leg of a Worker-Server call as
        measured (``worker_server_leg``); None: the links' own."""
        if algo != "ps" or self.worker_server_leg is None or not phases or not phases[0].transfers:
            return None
        latency, rate = self.worker_server_leg
        first = phases[0].transfers[0]
        # as work (latency_as_work) a leg's latency costs half on each end: twice the measured, alone
        return 2 * latency if self.latency_as_work else latency, rate / self.bottleneck(first.src, first.dst)

    def send_costs(self, runnable: int) -> tuple[float, float] | None:
        """(handoff wake, step latency) of a pipeline send while ``runnable`` ranks compute or call, from
        the tables measured by world size (interpolated, held at the ends; the step latency the handoffs' own
        where measured, else the ring step's); None without the tables."""
        if not self.step_latency_by_ranks:
            return None
        wake = _by_ranks(self.handoff_by_ranks, runnable) if self.handoff_by_ranks else self.handoff_latency
        return wake, _by_ranks(self.step_latency_by_ranks, runnable)

    def late_recv(self, runnable: int) -> float:
        """Seconds a pipeline receive posted after its send takes while ``runnable`` ranks compute or call (0
        without the table: it waits for the data alone)."""
        return _by_ranks(self.late_recv_by_ranks, runnable)

    @property
    def capacities(self) -> np.ndarray:
        return np.asarray(self._capacity, dtype=float)

    def channel_name(self, channel: int) -> str:
        src, dst = self._channels[channel]
        return f"{src}<->{dst}" if self._half_duplex[channel] else f"{src}->{dst}"

    def channel_kind(self, channel: int) -> str:
        return self._kind[channel]

    @property
    def num_channels(self) -> int:
        return len(self._channels)

    def machine(self, node: str) -> int | None:
        """Index of the server box (DGX node, workstation...) the node sits in."""
        return self.graph.nodes[node]["machine"]

    def route_kinds(self, src: str, dst: str) -> tuple[str, ...]:
        return tuple(self._kind[c] for c in self.route(src, dst))

    def _route_array(self, src: str, dst: str) -> np.ndarray:
        array = np.asarray(self.route(src, dst), dtype=np.int64)
        array.flags.writeable = False
        return array

    def _bottleneck(self, src: str, dst: str) -> float:
        """The smallest capacity (bytes/s) on the route."""
        return float(min((self._capacity[c] for c in self.route(src, dst)), default=math.inf))

    def _route_latency(self, src: str, dst: str) -> float:
        return float(sum(self._latency[c] for c in self.route(src, dst)))

    def _route(self, src: str, dst: str) -> tuple[int, ...]:
        """Channel ids from src to dst (cached). Empty for src == dst.

        A plain Dijkstra over a per-machine adjacency index rather than networkx's: a fabric
        switch may have thousands of neighbours, and the index lets the search look only at
        the two machines involved, which keeps 1,000-GPU topologies routing in microseconds.
        """
        if src == dst:
            return ()
        for node in (src, dst):
            if node not in self.graph:
                raise SimparError(f"topology {self.name}: no node named {node!r}")
        adjacency, machine_of, kind_of, touches, fabric = self._adjacency()
        machines = set((machine_of[src], machine_of[dst], None))  # (the order the search always took)
        relays = ENDPOINT_KINDS - {"gpu"} if self.gpus_forward else ENDPOINT_KINDS
        best = {src: 0.0}
        previous: dict[str, str] = {}
        heap = [(0.0, 0, src)]
        counter = 1
        while heap:
            dist, _, u = heapq.heappop(heap)
            if u == dst:
                break
            if dist > best[u]:  # (relays other than dst are never pushed: below)
                continue
            neighbours = adjacency[u]
            for machine in machines:
                for v, cost, affinity in neighbours.get(machine, ()):
                    if v != dst and (kind_of[v] in relays or  # an end point other than dst leads nowhere,
                                     (machine_of[v] is None and machines.isdisjoint(touches[v])
                                      and fabric[v] <= {u})):  # nor does a switch of other boxes only
                        continue
                    if affinity and src not in affinity and dst not in affinity:
                        cost += _FOREIGN_NIC_PENALTY
                    reached = dist + cost
                    if reached < best.get(v, math.inf):
                        best[v] = reached
                        previous[v] = u
                        heapq.heappush(heap, (reached, counter, v))
                        counter += 1
        if dst not in previous:
            raise SimparError(f"topology {self.name}: no route from {src} to {dst}")
        path = [dst]
        while path[-1] != src:
            path.append(previous[path[-1]])
        path.reverse()
        return tuple(self._channel_ids[(a, b)] for a, b in zip(path, path[1:]))

    def _adjacency(self) -> tuple:
        """(node -> machine -> [(neighbour, cost, neighbour's NIC affinity)], node -> machine, node -> kind,
        node -> the boxes its neighbours sit in, node -> its fabric neighbours), built once."""
        if self._adjacency_index is None:
            nodes = self.graph.nodes
            index: dict[str, dict] = {u: {} for u in self.graph}
            for u, v, data in self.graph.edges(data=True):
                for a, b in ((u, v), (v, u)):
                    node = nodes[b]
                    index[a].setdefault(node["machine"], []).append((b, data["cost"], node["affinity"]))
            self._adjacency_index = (index, {u: nodes[u]["machine"] for u in nodes},
                                     {u: nodes[u]["kind"] for u in nodes},
                                     {u: {m for m in index[u] if m is not None} for u in nodes},
                                     {u: frozenset(v for v, _, _ in index[u].get(None, ())) for u in nodes})
        return self._adjacency_index


def _by_ranks(table: dict[int, float] | None, runnable: int) -> float:
    """A table measured by world size read at ``runnable`` ranks (interpolated, held at the ends; 0 without one)."""
    if not table:
        return 0.0
    keys = sorted(table)
    return float(np.interp(runnable, keys, [table[k] for k in keys]))
