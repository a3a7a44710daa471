"""The fast path for large 3D plans: every op at a fixed duration, the step a longest path.

``simpar search`` and ``simpar validate --published`` price thousands of pipeline stages x micro-
batches, where SimPy's per-event cost dominates (a 3,072-GPU Table 1 row: 25 s). Here each
distinct network op is simulated once on an otherwise idle network (a collective by its
expansion, a pipeline send with every rank of its program at once, as the simulator issues them)
and every later one takes that time; compute is priced as the simulator prices it. The step is then
a longest path through the Plan: each stream runs its ops in order, an op starts when its stream
is free and its dependencies are done, a receive ends when its send has landed.

What it leaves out is contention between ops that overlap in time (two stages' sends on one
switch uplink, data-parallel reductions of several stages at once): the full simulation
(``simulate``) prices that. Tests hold this path to the full simulation on small layouts.
"""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
import simpy

from simpar.collectives import collective, plan_call, point_to_point, protocol_for
from simpar.engine import Network
from simpar.plan import Alloc, Collective, Compute, Copy, Free, Plan, Recv, Send
from simpar.scenario import Scenario
from simpar.sim.op_costs import OpCosts
from simpar.errors import SimparError
from simpar.sim.tracker import MemoryTracker, walk
from simpar.topologies.graph import Topology


class _Durations:
    """Each op's duration; network ops simulated alone, once per distinct kind."""

    def __init__(self, plan: Plan, scenario: Scenario, topology: Topology, network_cache: dict | None = None):
        self.plan, self.topology = plan, topology
        self.costs = OpCosts(plan, scenario, topology)
        self._cache: dict = {}
        # a network op's time depends only on the ranks that issue it and what it moves: plans on the same
        # grid and topology (a search's candidates, extrapolation points) can share these
        self._network = {} if network_cache is None else network_cache
        self._grid = (plan.grid.dp, plan.grid.pp, plan.grid.tp)
        self.calls: Counter = Counter()  # network op -> times performed in this step

    def of(self, pi: int, op) -> float:
        if isinstance(op, Compute):  # ops alike in every field that prices them cost the same
            key = (op.phase, op.unit, op.part, op.flops, op.bytes, op.params, op.device,
                   pi if op.device == "host" else None)
            if key not in self._cache:
                self._cache[key] = self.costs.compute_time(self.plan.programs[pi], op)
            return self._cache[key] + self.costs.resume(pi, op)
        key = self.network_key(pi, op)
        if key is None:
            return 0.0  # Alloc, Free (and Recv, which waits for its send instead)
        if key not in self._network:
            self._network[key] = self._price(pi, op)
        self.calls[key] += 1
        return self._network[key][0]

    def network_key(self, pi: int, op) -> tuple | None:
        """What a network op's time depends on (None: not a network op)."""
        if isinstance(op, Collective):
            key = (pi, op.op, op.algo, op.group, op.nbytes, op.pieces, op.itemsize, self.costs.wake(pi, op))
        elif isinstance(op, Send):
            key = ("send", pi, op.peer, op.nbytes, self.costs.wakes(pi, op))
        elif isinstance(op, Copy):
            key = ("copy", pi, op.src, op.dst, op.nbytes)
        else:
            return None
        return (self._grid, *key)

    def _price(self, pi: int, op) -> tuple:
        """A network op on an idle network, issued for all of its program's ranks at once: (seconds,
        bytes sent and received per node, bytes per channel)."""
        prog, gpus, topology = self.plan.programs[pi], self.topology.gpus, self.topology
        env = simpy.Environment()
        network = Network(env, topology)
        if isinstance(op, Collective):
            groups = self.plan.groups(prog, op.group)
            if len(groups[0]) < 2:
                return 0.0, Counter(), Counter(), None
            phases = plan_call(op, topology, [[gpus[r] for r in g] for g in groups])
            event = collective(network, phases, "", protocol_for(topology, op.algo or "ring", phases),
                               self.costs.wake(pi, op), op.algo)
        elif isinstance(op, Send):
            event = point_to_point(network, [(gpus[r], gpus[self.plan.grid.peer(r, op.peer)], op.nbytes, 1)
                                             for r in prog.ranks], wakes=self.costs.wakes(pi, op))
        else:
            node = self.costs.node
            event = network.transfer_all([(node(r, op.src), node(r, op.dst), op.nbytes, 1) for r in prog.ranks])
        env.run(until=event)
        return float(env.now), Counter(network.sent), Counter(network.received), network.channel_bytes

    def traffic(self) -> tuple[Counter, Counter, np.ndarray]:
        """Bytes sent and received per node and carried per channel by every network op of the step."""
        sent, received = Counter(), Counter()
        channels = np.zeros(self.topology.num_channels)
        for key, count in self.calls.items():
            _, out, into, carried = self._network[key]
            for node, nbytes in out.items():
                sent[node] += count * nbytes
            for node, nbytes in into.items():
                received[node] += count * nbytes
            if carried is not None:
                channels += count * carried
        return sent, received, channels


def price_shared(plan: Plan, scenario: Scenario, topology: Topology, cache: dict, mine: bool, exchange) -> None:
    """Fill ``cache`` with every network op of ``plan``, priced half here and half by a peer process pricing the
    same ops of its own plan (the other point of an extrapolation): this side prices the ops whose key's
    checksum has parity ``mine``, ``exchange(priced)`` hands them over and returns the peer's. The cache then
    holds what ``run`` would have priced itself, each op on an idle network either way."""
    durations = _Durations(plan, scenario, topology, cache)
    ops = {}
    for pi, prog in enumerate(plan.programs):
        for op in prog.ops:
            key = durations.network_key(pi, op)
            if key is not None and key not in cache:
                ops.setdefault(key, (pi, op))
    priced = {key: durations._price(pi, op) for key, (pi, op) in ops.items()
              if (zlib.crc32(repr(key).encode()) % 2 == 0) == mine}
    sparse = {key: (t, sent, received, None if c is None else (np.flatnonzero(c), c[np.flatnonzero(c)]))
              for key, (t, sent, received, c) in priced.items()}
    for key, (t, sent, received, carried) in exchange(sparse).items():
        if carried is not None:
            channels, nbytes = carried
            carried = np.zeros(topology.num_channels)
            carried[channels] = nbytes
        cache.setdefault(key, (t, sent, received, carried))
    cache.update(priced)


def step_time(plan: Plan, scenario: Scenario, topology: Topology, network_cache: dict | None = None) -> float:
    """One step of ``plan`` with every op at its fixed duration (see the module docstring);
    ``network_cache`` (a dict kept by the caller) shares network ops' times between plans on ``topology``."""
    return run(plan, scenario, topology, network_cache)[0]


def run(plan: Plan, scenario: Scenario, topology: Topology, network_cache: dict | None = None, times=None):
    """(step time, the durations with the step's network ops counted: ``.traffic()`` gives its bytes);
    ``times``, when given (a list per program), gets each op's (ready, start, end) as the simulator's."""
    durations = _Durations(plan, scenario, topology, network_cache)
    end = [[None] * len(p.ops) for p in plan.programs]
    landed: dict[str, float] = {}  # send tag -> when its bytes arrived
    queues = []  # (program, ops of one stream in order, [next index, time the stream is free])
    serial = not scenario.strategy.overlap_comm  # as the simulator: a program's ops one after another,
    for pi, prog in enumerate(plan.programs):  # its sends leaving without holding the others up
        streams: dict[str, list] = {}
        for op in prog.ops:
            streams.setdefault("all" if serial else op.stream, []).append(op)
        queues += [(pi, ops, [0, 0.0]) for ops in streams.values()]
    remaining = sum(len(p.ops) for p in plan.programs)
    while remaining:
        progressed = False
        for pi, ops, state in queues:
            done, index, free = end[pi], state[0], state[1]
            while index < len(ops):
                op = ops[index]
                ready = start = free
                blocked = False
                for d in op.deps:
                    finished = done[d]
                    if finished is None:
                        blocked = True
                        break
                    start = max(start, finished)
                kind = type(op)
                if blocked or (kind is Recv and op.tag not in landed):
                    break
                if kind is Recv:
                    free = max(start, landed[op.tag])
                elif kind is Alloc or kind is Free:
                    free = start
                elif kind is Send:
                    landed[op.tag] = start + durations.of(pi, op)
                    free = start if serial else landed[op.tag]
                else:
                    free = start + durations.of(pi, op)
                if times is not None:
                    times[pi][op.id] = (ready, start, free)
                done[op.id] = free
                index += 1
            if index > state[0]:
                remaining -= index - state[0]
                state[0], state[1] = index, free
                progressed = True
        if not progressed:
            raise RuntimeError("plan deadlocked: no stream can take its next op")
    return max((t for program in end for t in program), default=0.0), durations


def allocates_on_one_stream(plan: Plan) -> bool:
    """Whether every program allocates and frees on one stream only (every Megatron 3D plan: the compute
    stream): then that stream's order is the order in time, and walking the ops in program order gives
    exactly the simulated peaks; allocations on several streams (ZeRO-3's gather buffers) interleave by
    their timing, which needs the full simulation."""
    return all(len({op.stream for op in prog.ops if isinstance(op, (Alloc, Free))}) <= 1 for prog in plan.programs)


def memory(plan: Plan) -> list[dict] | None:
    """Each program's memory report (peak per category), or None where the fast path cannot say it
    (``allocates_on_one_stream``)."""
    return [walk(prog).report() for prog in plan.programs] if allocates_on_one_stream(plan) else None


class FastRun:
    """The fast path in the shape ``simulate`` reads a Simulator: times per op, bytes per node,
    memory trackers (3D plans: see ``memory``) and the network's bytes per channel."""

    def __init__(self, plan: Plan, scenario: Scenario, topology: Topology, network_cache: dict | None = None):
        if not allocates_on_one_stream(plan):
            raise SimparError(f"the fast path: {plan.strategy} allocates memory on several streams at once, whose "
                              "order only the full simulation knows (simulate it without fast=True)")
        self.plan, self.topology, self.scenario, self.network_cache = plan, topology, scenario, network_cache
        self.times = [[None] * len(p.ops) for p in plan.programs]
        self.memory = [MemoryTracker() for _ in plan.programs]
        self.network = Network(simpy.Environment(), topology)
        self.copied: Counter = Counter()

    def run(self) -> float:
        step, durations = run(self.plan, self.scenario, self.topology, self.network_cache, times=self.times)
        self.sent, self.received, self.network.channel_bytes = durations.traffic()
        self.send_issued = {}
        for pi, prog in enumerate(self.plan.programs):
            for op in prog.ops:
                if isinstance(op, (Alloc, Free)):  # one stream allocates: program order is time order
                    self.memory[pi].apply(op, self.times[pi][op.id][2])
                elif isinstance(op, Send):
                    self.send_issued[op.tag] = self.times[pi][op.id][1]
                elif isinstance(op, Copy):
                    for rank in prog.ranks:
                        self.copied[rank] += op.nbytes
        return step
