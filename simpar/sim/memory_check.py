"""Out-of-memory prediction: which rank, which category, by how much, and what would fit."""

from __future__ import annotations

from collections import defaultdict

from simpar import units
from simpar.errors import SimparError
from simpar.plan import Plan
from simpar.scenario import STRATEGY_NAMES, Scenario, make_scenario
from simpar.sim.tracker import walk
from simpar.strategies import build_plan


def check_memory(scenario: Scenario, plan: Plan, gpu, topology, trackers=None) -> None:
    """Raise SimparError if any rank's GPU (or any machine's host memory) would overflow."""
    trackers = trackers or [walk(p) for p in plan.programs]
    for prog, tracker in zip(plan.programs, trackers):
        peak = tracker.peak["gpu"]
        if peak > gpu.memory_bytes:
            category = max(tracker.at_peak, key=tracker.at_peak.get)
            rank = prog.ranks[0]
            where = f" ({prog.name})" if len(plan.programs) > 1 else ""
            raise SimparError(
                f"out of memory: rank {rank}{where} needs {units.human_bytes(peak)} at its peak but the "
                f"{gpu.name} has {units.human_bytes(gpu.memory_bytes)}: {units.human_bytes(peak - gpu.memory_bytes)} "
                f"over; largest category {category} = {units.human_bytes(tracker.at_peak[category])} "
                f"({_breakdown(tracker.at_peak)}). {_alternatives(scenario, gpu)}")
    check_host(plan, trackers, topology)


def _breakdown(at_peak: dict) -> str:
    return ", ".join(f"{c} {units.human_bytes(v)}" for c, v in at_peak.items() if v)


def check_host(plan: Plan, trackers, topology) -> None:
    per_machine: dict = defaultdict(int)
    for prog, tracker in zip(plan.programs, trackers):
        for rank in prog.ranks:
            per_machine[topology.machine(topology.gpus[rank])] += tracker.peak["host"]
    for name, data in topology.graph.nodes(data=True):
        if data["kind"] == "host" and per_machine.get(data["machine"], 0) > data["spec"].memory_bytes:
            need = per_machine[data["machine"]]
            raise SimparError(f"out of memory: host memory of machine {data['machine']} ({name}) needs "
                              f"{units.human_bytes(need)} for its ranks' offloaded states but has "
                              f"{units.human_bytes(data['spec'].memory_bytes)}; try zero3-infinity or more GPUs")


def _alternatives(scenario: Scenario, gpu) -> str:
    """Strategies that would fit on the same GPUs with the same batch, tried by program-order memory."""
    fits = []
    train, spec, cluster = scenario.train, scenario.strategy, scenario.cluster
    for name in STRATEGY_NAMES:
        if name == spec.name:
            continue
        try:
            alt = make_scenario(scenario.model, name, cluster.gpus, topology=cluster.topology, device=cluster.device,
                                micro_batch=train.micro_batch, global_batch=train.global_batch,
                                precision=train.precision, optimizer=train.optimizer,
                                recompute=spec.recompute, flash_attention=spec.flash_attention)
            plan = build_plan(alt)
        except SimparError:
            continue
        if all(walk(p).peak["gpu"] <= gpu.memory_bytes for p in plan.programs):
            fits.append(name)
    if spec.recompute != "full":
        hint = " Activation recomputation (--recompute full) or a smaller --micro-batch also saves memory."
    else:
        hint = " A smaller --micro-batch also saves memory."
    if fits:
        return f"Strategies that fit: {', '.join(fits)}.{hint}"
    return f"No other strategy fits with default degrees; try --strategy 3d with --tp/--pp.{hint}"
