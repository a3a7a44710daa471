"""Price a Plan on a topology with SimPy: one process per (program, stream).

Compute is a roofline on the GPU (FLOPs at the achievable rate for the precision, or HBM bytes,
whichever takes longer); the CPU's optimizer step runs at the host's Adam rate shared by the
ranks on that machine; the executor's CPU ranks share their machine's cores with whichever ranks
compute at the same moment (sim/cores.py); collectives expand through their algorithm into transfers on the shared
network; copies and pipeline sends are transfers between the rank's GPU, host memory and NVMe.

Speed at 1,000+ GPUs: a Program stands for all its identical ranks, so each collective is issued
once for all of their groups at once. When exactly one stream of the whole Plan uses the network
(plain data parallelism, ZeRO, tensor parallelism without a pipeline), nothing can contend with a
collective, so a collective that was already simulated with the same groups and size is replayed
from its recorded duration and traffic instead of being simulated again.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import simpy

from simpar.collectives import collective, plan_call, point_to_point, protocol_for
from simpar.engine import Network
from simpar.errors import SimparError
from simpar.plan import (
    STREAMS,
    Alloc,
    Collective,
    Compute,
    Copy,
    Free,
    Plan,
    Recv,
    Send,
)
from simpar.scenario import Scenario
from simpar.sim.cores import SharedCores
from simpar.sim.op_costs import OpCosts
from simpar.sim.tracker import MemoryTracker
from simpar.topologies.graph import Topology

NETWORK_OPS = (Collective, Send, Copy)
PROGRESS_EVERY = 4096


class _CollectiveEntry:
    """A collective expanded once: its phases, traffic per node, and (replayable) cost."""

    def __init__(self, phases):
        self.phases = phases
        self.sent: Counter = Counter()
        self.received: Counter = Counter()
        for phase in phases:
            for t in phase.transfers:
                self.sent[t.src] += t.nbytes
                self.received[t.dst] += t.nbytes
        self.calls = 0
        self.replays = 0
        self.protocol = None
        self.duration: float | None = None
        self.channel_bytes: np.ndarray | None = None


class Simulator:
    def __init__(self, plan: Plan, scenario: Scenario, topology: Topology, replay: bool = True,
                 serial: bool = False, record_links: bool = False, progress=None):
        if len(topology.gpus) < plan.grid.world:
            raise SimparError(f"--gpus: the plan needs {plan.grid.world} GPUs, topology has {len(topology.gpus)}")
        self.plan, self.scenario, self.topology = plan, scenario, topology
        self.env = simpy.Environment()
        self.network = Network(self.env, topology, record_utilisation=record_links)
        self.costs = OpCosts(plan, scenario, topology)
        self.compute_time, self._node = self.costs.compute_time, self.costs.node
        # CPU ranks sharing a machine's cores: a compute's time depends on how many compute with it
        self.cores = SharedCores(self.env, topology.core_slowdown) if topology.core_slowdown else None
        self.done = [[self.env.event() for _ in prog.ops] for prog in plan.programs]
        self.times: list[list[tuple[float, float, float] | None]] = [[None] * len(p.ops) for p in plan.programs]
        self.memory = [MemoryTracker() for _ in plan.programs]
        self.sent: Counter = Counter()  # node -> bytes of collectives and pipeline sends
        self.received: Counter = Counter()
        self.copied: Counter = Counter()  # rank -> bytes of offload copies (both ways)
        self._entries: dict = {}
        self._groups: dict = {}
        self._arrivals: dict[str, simpy.Event] = {}
        self.send_issued: dict[str, float] = {}
        users = {(i, op.stream) for i, p in enumerate(plan.programs) for op in p.ops if isinstance(op, NETWORK_OPS)}
        # replay "always" (strategy search): repeat a collective's first cost even where other streams could
        # contend with it - an approximation that makes 3D plans cheap to price
        self.replay = (replay == "always" or (replay and len(users) <= 1)) and not record_links
        # serial: every op of a program one after another in program order, as the reference executor
        # performs them (sends still leave without waiting, like its isend); otherwise streams overlap
        self.serial = serial
        self.progress = progress  # progress(ops done): told every PROGRESS_EVERY ops (a progress bar)
        self.ops_done = 0

    def run(self) -> float:
        for pi, prog in enumerate(self.plan.programs):
            if self.serial:
                self.env.process(self._stream(pi, prog.ops))
                continue
            for stream in STREAMS:
                ops = [op for op in prog.ops if op.stream == stream]
                if ops:
                    self.env.process(self._stream(pi, ops))
        self.env.run()
        for pi, prog in enumerate(self.plan.programs):
            stuck = [op for op in prog.ops if not self.done[pi][op.id].triggered]
            if stuck:
                raise RuntimeError(f"plan deadlocked: {prog.name} op {stuck[0]} never ran")
        for entry in self._entries.values():  # traffic of every call, counted once per kind
            for node, nbytes in entry.sent.items():
                self.sent[node] += nbytes * entry.calls
            for node, nbytes in entry.received.items():
                self.received[node] += nbytes * entry.calls
            if entry.replays and entry.channel_bytes is not None:
                self.network.channel_bytes += entry.replays * entry.channel_bytes
        return float(self.env.now)

    def _stream(self, pi: int, ops):
        done, times = self.done[pi], self.times[pi]
        for op in ops:
            ready = self.env.now
            waits = [done[d] for d in op.deps if not done[d].processed]
            if waits:
                yield self.env.all_of(waits)
            start = self.env.now
            action = self._perform(pi, op)
            if action is not None and not (self.serial and isinstance(op, Send)):  # (sends leave without waiting)
                yield action
            times[op.id] = (ready, start, self.env.now)
            done[op.id].succeed()
            self.ops_done += 1
            if self.progress is not None and self.ops_done % PROGRESS_EVERY == 0:
                self.progress(self.ops_done)

    def _perform(self, pi: int, op):
        prog = self.plan.programs[pi]
        if isinstance(op, (Alloc, Free)):
            self.memory[pi].apply(op, self.env.now)
            return None
        if isinstance(op, Compute):
            seconds = self.compute_time(prog, op) + self.costs.resume(pi, op)
            if self.cores is not None:
                return self.cores.run(seconds, len(prog.ranks))
            return self.env.timeout(seconds)
        if isinstance(op, Collective):
            return self._collective(pi, op)
        if isinstance(op, Send):
            return self._send(prog, op, self.costs.wakes(pi, op))
        if isinstance(op, Recv):
            return self._receive(prog, op)
        if isinstance(op, Copy):
            return self._copy(prog, op)
        raise TypeError(f"unknown op {op!r}")

    def _collective(self, pi: int, op: Collective):
        if (pi, op.group) not in self._groups:
            self._groups[(pi, op.group)] = tuple(self.plan.groups(self.plan.programs[pi], op.group))
        groups = self._groups[(pi, op.group)]
        if len(groups[0]) < 2:
            return None
        wake = self.costs.wake(pi, op)
        key = (op.op, op.algo, pi, op.group, op.nbytes, op.pieces, op.itemsize, wake)
        entry = self._entries.get(key)
        if entry is None:
            gpus = self.topology.gpus
            entry = self._entries[key] = _CollectiveEntry(plan_call(op, self.topology,
                                                                    [[gpus[r] for r in g] for g in groups]))
            entry.protocol = protocol_for(self.topology, op.algo or "ring", entry.phases)
        entry.calls += 1
        if self.replay and entry.duration is not None:
            entry.replays += 1
            return self.env.timeout(entry.duration)
        start, before = self.env.now, self.network.channel_bytes.copy()
        process = collective(self.network, entry.phases, f"{op.payload} ", entry.protocol, wake, op.algo)
        if self.replay:
            def record(_, entry=entry):
                entry.duration = self.env.now - start
                entry.channel_bytes = self.network.channel_bytes - before
            process.callbacks.append(record)
        return process

    def _send(self, prog, op: Send, wakes: bool):
        transfers = []
        for rank in prog.ranks:
            src, dst = self.topology.gpus[rank], self.topology.gpus[self.plan.grid.peer(rank, op.peer)]
            transfers.append((src, dst, op.nbytes, 1))
            self.sent[src] += op.nbytes
            self.received[dst] += op.nbytes
        self.send_issued[op.tag] = self.env.now
        runnable = self._runnable(prog) if self.cores is not None else None  # computing now, and each pair
        event = point_to_point(self.network, transfers, f"{op.tag} ", wakes, runnable)
        arrival = self._arrival(op.tag)
        event.callbacks.append(lambda _: arrival.succeed())
        return event

    def _receive(self, prog, op: Recv):
        """A receive waits for its data to land; one posted after its send was issued waits at least the
        topology's ``late_recv`` and its bytes from its posting: gloo moves a message only once both ends
        have posted it, so the data the simulator had sent ahead leaves when the receive is posted."""
        arrival = self._arrival(op.tag)
        if self.cores is None or op.tag not in self.send_issued:
            return arrival
        late = self.topology.late_recv(self._runnable(prog))
        if not late:
            return arrival
        rank = prog.ranks[0]
        src, dst = self.topology.gpus[self.plan.grid.peer(rank, op.peer)], self.topology.gpus[rank]
        return self.env.all_of([arrival, self.env.timeout(late + op.nbytes / self.topology.bottleneck(src, dst))])

    def _runnable(self, prog) -> int:
        """Ranks sharing the cores now for a pipeline message of ``prog``: those computing, and each pair of it."""
        return min(self.plan.grid.world, self.cores.computing() + 2 * len(prog.ranks))

    def _arrival(self, tag: str) -> simpy.Event:
        if tag not in self._arrivals:
            self._arrivals[tag] = self.env.event()
        return self._arrivals[tag]

    def _copy(self, prog, op: Copy):
        transfers = []
        for rank in prog.ranks:
            transfers.append((self._node(rank, op.src), self._node(rank, op.dst), op.nbytes, 1))
            self.copied[rank] += op.nbytes
        return self.network.transfer_all(transfers, f"copy {op.payload} ")
