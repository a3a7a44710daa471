"""The simulator: build a Scenario's Plan, check it fits in memory, price it, report per rank."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tqdm import tqdm

from simpar import topologies
from simpar.flops import utilisation
from simpar.plan import CATEGORIES, OP_CLASSES, Plan, Recv, op_class
from simpar.scenario import Scenario
from simpar.sim.breakdown import PARTS, program_breakdown
from simpar.sim.memory_check import check_memory
from simpar.sim.fast import FastRun
from simpar.sim.runner import Simulator
from simpar.spread import draws_for
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
    op_timeline: list[dict] = field(default_factory=list)  # per program: every op's start and end
    link_timeline: list[dict] = field(default_factory=list)  # per channel: utilisation over time (record_links)
    flops: dict = field(default_factory=dict)  # model_flops_per_gpu_s, mfu, hfu (simpar.flops)
    draw_steps: list[float] = field(default_factory=list)  # each draw's step where the step is their mean

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
    step's first receive, and the executor times it there (pp at 2 ranks on the development VM, 2026-11-28:
    the second stage's first receive priced 5.2 ms and measured 12.8, its tail of 7.5 ms after the step's
    last send); 0 for any other program, whose step begins with its own work."""
    first = next((op for op in prog.ops if op_class(op)), None)
    if not isinstance(first, Recv):
        return 0.0
    return max(0.0, step_time - max(sim.times[pi][op.id][2] for op in prog.ops if op_class(op)))


def simulate(scenario: Scenario, topology: Topology | None = None, plan: Plan | None = None,
             replay: bool = True, check_oom: bool = True, serial: bool = False,
             record_links: bool = False, progress: bool = False, fast: bool = False,
             draws: int | None = None) -> SimResult:
    """Simulate one training step. Raises SimparError (naming rank and category) on OOM.
    ``serial`` prices each rank's ops one after another, as the reference executor runs them;
    ``record_links`` keeps every link's utilisation over time (and so simulates without replay);
    ``fast`` prices every op at a fixed duration (sim/fast.py: no contention between overlapping ops), except
    on CPU ranks sharing cores, whose compute times depend on how many compute at once (sim/cores.py);
    ``draws``: where the topology carries the measured spread of a pipeline send's hold, the step is the mean of
    this many simulations, each send's hold drawn from it (simpar/spread.py; None: ``DRAWS``, 0: one simulation,
    every send at its mean)."""
    topology = topology or build_topology(scenario)
    plan = plan or build_plan(scenario)
    if check_oom:
        check_memory(scenario, plan, topology.graph.nodes[topology.gpus[0]]["spec"], topology)
    serial = serial or not scenario.strategy.overlap_comm
    most = draws_for(topology, plan, serial)
    count = most if draws is None else min(draws, most)
    if not count:
        return simulate_once(scenario, topology, plan, replay, check_oom, serial, record_links, progress, fast)
    return _mean_of_draws(scenario, topology, [
        simulate_once(scenario, topology, plan, replay, check_oom, serial, record_links, progress, fast, draw)
        for draw in range(count)])


def _mean_of_draws(scenario: Scenario, topology: Topology, results: list[SimResult]) -> SimResult:
    """One result for several draws of a step: its time, breakdown and each rank's parts and busy time the
    means over the draws (each draw's parts add up to its step, so the means add up to the mean); bytes and
    memory are the same in every draw; timelines and links from the draw whose step is nearest the mean."""
    steps = [r.step_time_s for r in results]
    mean = sum(steps) / len(steps)
    nearest = min(results, key=lambda r: abs(r.step_time_s - mean))

    def averaged(dicts: list[dict]) -> dict:
        return {key: sum(d[key] for d in dicts) / len(dicts) for key in dicts[0]}

    ranks = [{**rank, "breakdown": averaged([r.ranks[i]["breakdown"] for r in results]),
              "op_time": averaged([r.ranks[i]["op_time"] for r in results])} for i, rank in enumerate(nearest.ranks)]
    spread = (sum((t - mean) ** 2 for t in steps) / len(steps)) ** 0.5
    note = (f"pipeline sends: each one's hold drawn from its measured spread; the step is the mean of "
            f"{len(steps)} draws (SD {1e3 * spread:.2f} ms; simpar/spread.py), timelines from the draw nearest it")
    return replace(nearest, step_time_s=mean, breakdown=averaged([r.breakdown for r in results]), ranks=ranks,
                   notes=nearest.notes + [note], flops=utilisation(scenario, mean, topology), draw_steps=steps)


def simulate_once(scenario: Scenario, topology: Topology, plan: Plan, replay: bool = True, check_oom: bool = True,
                  serial: bool = False, record_links: bool = False, progress: bool = False, fast: bool = False,
                  draw: int | None = None) -> SimResult:
    """One simulation of the step, as ``simulate``'s arguments say (``serial`` as given: ``simulate`` adds the
    strategy's own); ``draw``: each pipeline send's hold drawn from its spread, seeded by it (None: its mean)."""
    gpu = topology.graph.nodes[topology.gpus[0]]["spec"]
    total = sum(len(p.ops) for p in plan.programs)
    # a bar on a terminal, for runs that take more than a couple of seconds (tqdm's delay)
    with tqdm(total=total, unit="op", desc="simulating", delay=2, disable=None if progress else True,
              leave=False) as bar:
        if fast and topology.core_slowdown is None:  # (ranks sharing cores: always the full simulation)
            sim = FastRun(plan, scenario, topology)
        else:
            sim = Simulator(plan, scenario, topology, replay=replay, serial=serial, record_links=record_links,
                            progress=lambda done: bar.update(done - bar.n), draw=draw)
        step_time = sim.run()
    if check_oom:  # streams may overlap allocations more than program order suggests
        check_memory(scenario, plan, gpu, topology, trackers=sim.memory)
    ranks, totals = [], dict.fromkeys(PARTS, 0.0)
    for pi, prog in enumerate(plan.programs):
        parts = program_breakdown(sim, pi, step_time)
        memory = sim.memory[pi].report()
        busy = dict.fromkeys(OP_CLASSES, 0.0)  # seconds each class of op ran (streams may overlap)
        for op in prog.ops:
            if op_class(op):
                busy[op_class(op)] += sim.times[pi][op.id][2] - sim.times[pi][op.id][1]
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
    ops = [{"program": prog.name, "ranks": list(prog.ranks),
            "ops": [{"op": op.id, "stream": op.stream, "class": op_class(op), "start": sim.times[pi][op.id][1],
                     "end": sim.times[pi][op.id][2]} for op in prog.ops if op_class(op)]}
           for pi, prog in enumerate(plan.programs)]
    usage = sim.network.utilisation or {}
    link_timeline = [{"name": topology.channel_name(c), "kind": topology.channel_kind(c), "points": points}
                     for c, points in sorted(usage.items())]
    notes = list(plan.notes) + [ACTIVATIONS_EXECUTOR if scenario.cluster.topology == "cpu-host" else ACTIVATIONS_MEGATRON]
    return SimResult(step_time, totals, ranks, links, server, notes, timeline, ops, link_timeline,
                     utilisation(scenario, step_time, topology))
