"""The network engine: transfers over topology routes, sharing channels fairly, on SimPy.

Sharing model (fluid, max-min fair). A transfer first waits out its latency (the sum of the
per-hop latencies on its route, once per step it stands for), then streams its bytes. While it
streams, every channel (one direction of a link) on its route is shared with the other streaming
transfers by *max-min fairness*: each transfer gets the largest rate such that no channel is
oversubscribed and no transfer could go faster without slowing one that is no faster than it
(progressive filling). So two transfers on one channel get half its bandwidth each; a transfer
held back elsewhere leaves its unused share to the others. Rates are recomputed only when a
transfer starts or ends, so the cost grows with the number of transfers, not bytes or packets.

Bulk steps: a transfer may stand for ``steps`` identical lock-step messages (a ring's N-1 steps):
it pays the latency ``steps`` times and carries all their bytes as one flow. That is exact on a
uniform ring and keeps a 1,000-GPU collective at a few thousand Python objects.

The engine is one SimPy process that sleeps until the next completion or a new arrival: SimPy
owns the clock and the event heap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import simpy

from simpar.topologies.graph import Topology


@dataclass
class TransferRecord:
    """One line of the timeline. ``start`` is when it was issued, ``end`` when its last byte landed."""

    tag: str
    src: str
    dst: str
    nbytes: int
    steps: int
    start: float
    end: float | None = None


@dataclass
class _Flow:
    route: np.ndarray
    remaining: float
    record: TransferRecord
    on_done: Callable[["_Flow"], None]
    tolerance: float = field(init=False)

    def __post_init__(self):
        self.tolerance = max(1e-9 * self.remaining, 1e-6)


def max_min_rates(entry_flow: np.ndarray, entry_channel: np.ndarray, capacity: np.ndarray,
                  n_flows: int) -> np.ndarray:
    """Max-min fair rates by progressive filling.

    ``entry_flow[i]`` crosses ``entry_channel[i]``: one entry per (flow, channel on its route).
    Each round finds the channel(s) whose remaining capacity split over their unfrozen flows is
    smallest, freezes those flows at that share, and takes their rate off every channel they use.
    """
    channels, local, users = np.unique(entry_channel, return_inverse=True, return_counts=True)
    cap = capacity[channels].astype(float)
    rate = np.zeros(n_flows)
    # a flow that shares none of its channels runs at its route's bottleneck and slows no one: set
    # those at once (most flows of a pipeline's sends), and fill progressively only among the rest
    shared = np.zeros(n_flows, dtype=bool)
    shared[entry_flow[users[local] > 1]] = True
    alone = ~shared[entry_flow]
    if alone.any():
        bottleneck = np.full(n_flows, np.inf)
        np.minimum.at(bottleneck, entry_flow[alone], np.maximum(cap[local[alone]], 0.0))
        rate[~shared] = bottleneck[~shared]
    frozen = ~shared
    live = ~alone
    while live.any():
        counts = np.bincount(local[live], minlength=len(channels))
        share = np.full(len(channels), np.inf)
        used = counts > 0
        share[used] = np.maximum(cap[used], 0.0) / counts[used]
        level = share.min()
        tight = share <= level * (1 + 1e-12)
        hit = np.unique(entry_flow[live & tight[local]])
        rate[hit] = level
        frozen[hit] = True
        newly = live & frozen[entry_flow]
        cap -= np.bincount(local[newly], minlength=len(channels)) * level
        live &= ~frozen[entry_flow]
    return rate


class Network:
    """Moves bytes between topology nodes inside a SimPy environment, counting them."""

    def __init__(self, env: simpy.Environment, topology: Topology, record_utilisation: bool = False):
        self.env = env
        self.topology = topology
        self.capacity = topology.capacities
        # channel -> [(time, fraction of capacity in use)], each point where it changed (--trace)
        self.utilisation: dict[int, list[tuple[float, float]]] | None = {} if record_utilisation else None
        self._load = np.zeros(topology.num_channels)
        self.channel_bytes = np.zeros(topology.num_channels)
        self.sent: dict[str, int] = defaultdict(int)
        self.received: dict[str, int] = defaultdict(int)
        self.timeline: list[TransferRecord] = []
        self._flows: list[_Flow] = []
        self._arrivals: list[_Flow] = []
        self._rates = np.zeros(0)
        self._last_update = env.now
        self._wake = env.event()
        env.process(self._run())

    def transfer(self, src: str, dst: str, nbytes: int, steps: int = 1, tag: str = "") -> simpy.Event:
        """Send ``nbytes`` from ``src`` to ``dst``; the returned event fires when they have landed."""
        return self.transfer_all([(src, dst, nbytes, steps)], tag)

    def transfer_all(self, transfers, tag: str = "", latency: float | None = None,
                     wire_fraction: float = 1.0, step_shift: float = 0.0) -> simpy.Event:
        """Start (src, dst, nbytes, steps) transfers at once; the event fires when all have landed.

        ``latency`` (a protocol's, see costs/nccl.py) replaces steps x the route's hop latencies;
        ``step_shift`` is added to each step's route latency (a calibrated CPU rank's call late in a series:
        sim/op_costs.py), at least 0 in all. ``wire_fraction`` < 1 means the protocol's flags take the
        rest of the wire: the payload (what is counted) streams at that fraction of the rate. Transfers
        with equal latency share one SimPy timeout, so a 1,000-rank phase costs a handful of events
        rather than a process per rank.
        """
        done = self.env.event()
        by_latency: dict[float, list[_Flow]] = defaultdict(list)
        messages: set[tuple[str, str]] = set()
        pending = [0]

        def finish(flow: _Flow) -> None:
            flow.record.end = float(self.env.now)
            pending[0] -= 1
            if pending[0] == 0:
                done.succeed()

        for src, dst, nbytes, steps in transfers:
            nbytes = int(nbytes)
            record = TransferRecord(tag, src, dst, nbytes, steps, float(self.env.now))
            self.timeline.append(record)
            route = self.topology.route_array(src, dst)
            if not len(route) or nbytes <= 0:
                record.end = record.start
                continue
            self.sent[src] += nbytes
            self.received[dst] += nbytes
            self.channel_bytes[route] += nbytes  # a route never repeats a channel
            delay = (steps * max(self.topology.route_latency(src, dst) + step_shift, 0.0)
                     if latency is None else latency)
            size = nbytes / wire_fraction
            if self.topology.latency_as_work:  # each end works half the latency, sharing its link (graph.py),
                # once per pair and call: a coalesced call's pieces between two ranks go in one message
                size += 0.0 if (src, dst) in messages else delay / 2 * self.topology.bottleneck(src, dst)
                messages.add((src, dst))
                delay = 0.0
            flow = _Flow(route, size, record, finish)
            by_latency[delay].append(flow)
            pending[0] += 1
        if pending[0] == 0:
            done.succeed()
        for latency, flows in by_latency.items():
            self.env.timeout(latency).callbacks.append(lambda _, flows=flows: self._arrive(flows))
        return done

    def _arrive(self, flows: list[_Flow]) -> None:
        self._arrivals.extend(flows)
        if not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        while True:
            if self._flows:
                horizon = float(min(f.remaining / r for f, r in zip(self._flows, self._rates)))
                # never a step too small to move the clock (near-infinite links at a late time)
                horizon = max(horizon, float(np.spacing(self.env.now)))
                yield self.env.any_of([self._wake, self.env.timeout(horizon)])
            else:
                yield self._wake
            self._advance()
            self._flows.extend(self._arrivals)
            self._arrivals.clear()
            if self._wake.triggered:
                self._wake = self.env.event()
            self._reallocate()

    def _advance(self) -> None:
        """Credit every streaming flow with what it moved since the last update; finish the done."""
        elapsed = self.env.now - self._last_update
        self._last_update = self.env.now
        still = []
        for flow, rate in zip(self._flows, self._rates):
            flow.remaining -= rate * elapsed
            if flow.remaining <= flow.tolerance:
                flow.on_done(flow)
            else:
                still.append(flow)
        self._flows = still

    def _reallocate(self) -> None:
        if not self._flows:
            self._rates = np.zeros(0)
            self._record(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
            return
        lengths = [len(f.route) for f in self._flows]
        entry_flow = np.repeat(np.arange(len(self._flows)), lengths)
        entry_channel = np.concatenate([f.route for f in self._flows])
        self._rates = max_min_rates(entry_flow, entry_channel, self.capacity, len(self._flows))
        self._record(entry_flow, entry_channel)

    def _record(self, entry_flow: np.ndarray, entry_channel: np.ndarray) -> None:
        """Note each channel whose share of its capacity in use changed, and when."""
        if self.utilisation is None:
            return
        rates = self._rates[entry_flow] if len(entry_flow) else np.zeros(0)
        load = np.bincount(entry_channel, weights=rates, minlength=len(self.capacity)) / self.capacity
        for channel in np.nonzero(np.abs(load - self._load) > 1e-9)[0]:
            self.utilisation.setdefault(int(channel), []).append((float(self.env.now), float(load[channel])))
        self._load = load

    def busiest_channels(self) -> list[tuple[str, str, int]]:
        """(name, kind, bytes) for every channel that carried bytes, busiest first."""
        used = np.nonzero(self.channel_bytes)[0]
        order = used[np.argsort(-self.channel_bytes[used], kind="stable")]
        return [(self.topology.channel_name(c), self.topology.channel_kind(c), int(self.channel_bytes[c]))
                for c in order]
