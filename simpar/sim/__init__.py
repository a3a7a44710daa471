"""The simulator: build a Scenario's Plan, check it fits in memory, price it, report per rank."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from simpar import topologies
from simpar.flops import utilisation
from simpar.plan import CATEGORIES, OP_CLASSES, Plan, Recv, op_class
from simpar.scenario import Scenario
from simpar.sim.breakdown import PARTS, program_breakdown
from simpar.sim.memory_check import check_memory
from simpar.sim.extrapolate import affine, points_for, with_microbatches
from simpar.sim.fast import FastRun, price_shared
from simpar.sim.forked import Forked
from simpar.sim.runner import Simulator
from simpar.strategies import build_plan
from simpar.topologies.graph import Topology


@dataclass
class SimResult:
    step_time_s: float
    breakdown: dict[str, float]  # seconds, averaged over ranks; adds up to step_time_s
    ranks: list[dict]
    links: list[dict]
    server: dict | None = None
    notes: list[str] = field(default_factory=list)
    memory_timeline: list[dict] = field(default_factory=list)  # per program: [(time, GPU bytes)]
    # per program: every op's start and end (or what makes it, called once when first read: most runs never read it)
    ops_of: Callable[[], list[dict]] | list[dict] = field(default_factory=list, repr=False)
    link_timeline: list[dict] = field(default_factory=list)  # per channel: utilisation over time (record_links)
    flops: dict = field(default_factory=dict)  # model_flops_per_gpu_s, mfu, hfu (simpar.flops)

    @property
    def op_timeline(self) -> list[dict]:
        if callable(self.ops_of):
            self.ops_of = self.ops_of()
        return self.ops_of

    def to_json(self, timeline: bool = False, ops: bool = False, links: bool = False) -> dict:
        data = {"step_time_s": self.step_time_s, **self.flops, "breakdown": self.breakdown, "ranks": self.ranks,
                "links": self.links, "notes": self.notes}
        if self.server is not None:
            data["server"] = self.server
        if timeline:
            data["memory_timeline"] = self.memory_timeline
        if ops:
            data["op_timeline"] = self.op_timeline
        if links:
            data["link_timeline"] = self.link_timeline
        return data


ACTIVATIONS_EXECUTOR = ("activations: what simpar's executor GPT saves for backward (PyTorch autograd, the CPU flash "
                        "attention kernel: ModelSpec.executor_activation_bytes)")
ACTIVATIONS_MEGATRON = "activations: Megatron-LM's, as Korthikanti et al. 2022 count them (ModelSpec.layer_activation_bytes)"


def build_topology(scenario: Scenario) -> Topology:
    cluster = scenario.cluster
    return topologies.build(cluster.topology, cluster.gpus, cluster.bandwidth, cluster.latency, cluster.device)


def _tail_wait(sim, prog, pi: int, step_time: float) -> float:
    """The step's time left after a program's last op, where the program's first timed op is a pipeline
    receive (a later stage): steps run back to back, so that stage waits out the step's tail in the next
    step's first receive, and the executor times it there; 0 for any other program, whose step begins with
    its own work."""
    first = next((op for op in prog.ops if op_class(op)), None)
    if not isinstance(first, Recv):
        return 0.0
    return max(0.0, step_time - max(sim.times[pi][op.id][2] for op in prog.ops if op_class(op)))


def simulate(scenario: Scenario, topology: Topology | None = None, plan: Plan | None = None,
             replay: bool = True, check_oom: bool = True, serial: bool = False,
             record_links: bool = False, progress: bool = False, fast: bool = False,
             extrapolate: bool = False, network_cache: dict | None = None) -> SimResult:
    """Simulate one training step. Raises SimparError (naming rank and category) on OOM.
    ``serial`` prices each rank's ops one after another, as the reference executor runs them;
    ``record_links`` keeps every link's utilisation over time (and so simulates without replay);
    ``fast`` prices every op at a fixed duration (sim/fast.py: no contention between overlapping ops), except
    on CPU ranks sharing cores, whose compute times depend on how many compute at once (sim/cores.py);
    ``extrapolate``: with ``fast``, a long pipeline's step from two short ones
    (sim/extrapolate.py); ``network_cache``: the fast path's network op times, shared between calls on ``topology``."""
    topology = topology or build_topology(scenario)
    if fast and extrapolate and plan is None and len(points_for(scenario)) > 1:
        return _extrapolated(scenario, topology, check_oom, serial, progress)
    plan = plan or build_plan(scenario)
    if check_oom and not fast:  # (the fast path checks its own trackers after the step)
        check_memory(scenario, plan, topology.graph.nodes[topology.gpus[0]]["spec"], topology)
    serial = serial or not scenario.strategy.overlap_comm
    return simulate_once(scenario, topology, plan, replay, check_oom, serial, record_links, progress, fast,
                         network_cache)


def _extrapolated(scenario: Scenario, topology: Topology, check_oom: bool, serial: bool, progress: bool) -> SimResult:
    """The step at the scenario's micro-batches from the fast path at two shorter counts (sim/extrapolate.py).
    With two cores or more the shorter point runs in a forked process beside the longer one, each pricing half
    of the network ops and handing them to the other (``fast.price_shared``)."""
    m, points = scenario.microbatches, points_for(scenario)

    def point(k: int, cache: dict, bar: bool, exchange=None, mine: bool = True) -> SimResult:
        at_k = with_microbatches(scenario, k)
        plan = build_plan(at_k)
        if exchange is not None:
            price_shared(plan, at_k, topology, cache, mine, exchange)
        return simulate(at_k, topology, plan=plan, check_oom=check_oom, serial=serial, progress=bar, fast=True,
                        network_cache=cache)

    def child(peer) -> dict:
        def exchange(priced: dict) -> dict:  # the child sends first, then takes the parent's
            peer.send(("priced", priced))
            return peer.recv()
        return point(points[0], {}, False, exchange, mine=True).to_json()

    shared: dict = {}  # the network ops of both points are the same: priced once
    beside = Forked(child) if (os.cpu_count() or 1) > 1 else None

    def exchange(priced: dict) -> dict:  # the parent takes the child's, then sends its own
        theirs = beside.receive("priced")
        beside.peer.send(priced)
        return theirs

    try:
        first = None if beside else point(points[0], shared, progress).to_json()
        last = point(points[1], shared, progress, exchange if beside else None, mine=False)
        first = beside.result() if beside else first
    finally:
        if beside:
            beside.close()
    results = [first, last.to_json()]
    data = affine(results, points, m)
    gpu = topology.graph.nodes[topology.gpus[0]]["spec"]
    if check_oom and any(r["memory"]["peak"] > gpu.memory_bytes for r in data["ranks"]):
        check_memory(scenario, build_plan(scenario), gpu, topology)  # says which rank and category, and raises
    note = (f"{m} micro-batches priced from {points[0]} and {points[1]} (a full pipeline's step is affine in them: "
            f"sim/extrapolate.py); timelines are of {points[1]}")
    return replace(last, step_time_s=data["step_time_s"], breakdown=data["breakdown"], ranks=data["ranks"],
                   links=data["links"], server=data.get("server"), notes=data["notes"] + [note],
                   flops=utilisation(scenario, data["step_time_s"], topology))


def simulate_once(scenario: Scenario, topology: Topology, plan: Plan, replay: bool = True, check_oom: bool = True,
                  serial: bool = False, record_links: bool = False, progress: bool = False, fast: bool = False,
                  network_cache: dict | None = None) -> SimResult:
    """One simulation of the step, as ``simulate``'s arguments say (``serial`` as given: ``simulate`` adds the
    strategy's own)."""
    gpu = topology.graph.nodes[topology.gpus[0]]["spec"]
    total = sum(len(p.ops) for p in plan.programs)
    # a bar on a terminal, for runs that take more than a couple of seconds (tqdm's delay)
    with tqdm(total=total, unit="op", desc="simulating", delay=2, disable=None if progress else True,
              leave=False) as bar:
        if fast and topology.core_slowdown is None:  # (ranks sharing cores: always the full simulation)
            sim = FastRun(plan, scenario, topology, network_cache)
        else:
            sim = Simulator(plan, scenario, topology, replay=replay, serial=serial, record_links=record_links,
                            progress=lambda done: bar.update(done - bar.n))
        step_time = sim.run()
    if check_oom:  # streams may overlap allocations more than program order suggests
        check_memory(scenario, plan, gpu, topology, trackers=sim.memory)
    ranks, totals = [], dict.fromkeys(PARTS, 0.0)
    for pi, prog in enumerate(plan.programs):
        parts = program_breakdown(sim, pi, step_time)
        memory = sim.memory[pi].report()
        busy = dict.fromkeys(OP_CLASSES, 0.0)  # seconds each class of op ran (streams may overlap)
        times = sim.times[pi]
        for op in prog.ops:
            kind = op_class(op)
            if kind:
                busy[kind] += times[op.id][2] - times[op.id][1]
        busy["pipeline p2p"] += _tail_wait(sim, prog, pi, step_time)
        for rank in prog.ranks:
            node = topology.gpus[rank]
            ranks.append({"rank": rank, "program": prog.name, "bytes_sent": int(sim.sent[node]),
                          "bytes_received": int(sim.received[node]), "offload_bytes": int(sim.copied[rank]),
                          "memory": memory, "breakdown": parts, "op_time": busy})
            for part in PARTS:
                totals[part] += parts[part] / plan.grid.world
    ranks.sort(key=lambda r: r["rank"])
    server = None
    if topology.server is not None and (sim.sent[topology.server] or sim.received[topology.server]):
        server = {"bytes_sent": int(sim.sent[topology.server]), "bytes_received": int(sim.received[topology.server])}
    links = [{"name": name, "kind": kind, "bytes": b} for name, kind, b in sim.network.busiest_channels()]
    timeline = [{"program": prog.name, "ranks": list(prog.ranks), "points": sim.memory[pi].timeline,
                 "categories": list(CATEGORIES), "by_category": sim.memory[pi].by_category}
                for pi, prog in enumerate(plan.programs)]
    def ops() -> list[dict]:
        return [{"program": prog.name, "ranks": list(prog.ranks),
                 "ops": [{"op": op.id, "stream": op.stream, "class": op_class(op), "start": sim.times[pi][op.id][1],
                          "end": sim.times[pi][op.id][2]} for op in prog.ops if op_class(op)]}
                for pi, prog in enumerate(plan.programs)]

    usage = sim.network.utilisation or {}
    link_timeline = [{"name": topology.channel_name(c), "kind": topology.channel_kind(c), "points": points}
                     for c, points in sorted(usage.items())]
    notes = list(plan.notes) + [ACTIVATIONS_EXECUTOR if scenario.cluster.topology == "cpu-host" else ACTIVATIONS_MEGATRON]
    return SimResult(step_time, totals, ranks, links, server, notes, timeline, ops, link_timeline,
                     utilisation(scenario, step_time, topology))
