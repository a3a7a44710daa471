"""Run a scenario for real and set it beside the simulator's prediction: ``simpar run --compare-real``.

The measured run is reported in the simulator's own schema (``SimResult.to_json``: step time,
breakdown, and per rank bytes, memory per category, time per op class) so the two can be laid
side by side; ``comparison`` gives each figure's relative error, (simulated - measured) / measured.
"""

from __future__ import annotations

import statistics

from simpar.plan import OP_CLASSES, op_class
from simpar.real.executor import check_supported, run_rank
from simpar.real.instrument import timeline_seconds
from simpar.real.launch import launch
from simpar.scenario import Scenario
from simpar.sim import PARTS
from simpar.sim.breakdown import part_of
from simpar.strategies import build_plan

MEMORY_ROWS = ("params", "grads", "optimizer", "activations", "buffers", "peak", "host")

def run_real(scenario: Scenario, steps: int, seed: int = 0, timeout: float = 600.0, backend: str = "gloo",
             progress=None, collectives: str = "explicit") -> dict:
    """Perform ``steps`` training steps on one process per rank; the measured run as sim-like JSON."""
    check_supported(scenario)
    world = scenario.strategy.world
    ranks = launch(run_rank, world, (scenario, steps, seed, collectives), timeout=timeout, backend=backend,
                   progress=progress)
    return real_json(scenario, ranks, steps, collectives)


def _per_step(nbytes: int | None, steps: int) -> int | None:
    return None if nbytes is None else nbytes // steps


def measured_step_time(step_times_by_rank: list[list[float]]) -> float:
    """The measured step time of a run: each rank's mean step, the first step left out when there are
    others (it warms up allocators and connections), and the slowest rank's. The ranks do not meet
    between steps (the executor sums the losses once, after the last step), so a rank's steps follow
    each other back to back and its mean step is the run's period, waits included; the ranks' means
    differ only where the run starts and ends. The mean over steps of each step's slowest rank, taken
    when a reporting all-reduce lined the ranks up after every step, counts a wait twice once ranks run
    freely (one rank's step ends in it, the next rank's begins with it): pp at 2 ranks, 150 steps, 34.69 ms
    against 34.13 / 34.14 ms per rank. The mean, not the median: a run takes the sum of its steps (its
    throughput is steps over that sum), and the simulator prices a step's expected time, its calibrated
    costs means with their stalls included (CPU step times are skewed by multi-millisecond stalls: the
    median would read a run faster than it ran)."""
    return max(statistics.fmean(times[1:] if len(times) > 1 else times) for times in step_times_by_rank)


def real_json(scenario: Scenario, ranks: list[dict], steps: int, collectives: str = "explicit") -> dict:
    step_time = measured_step_time([r["step_times"] for r in ranks])
    out_ranks, totals = [], dict.fromkeys(PARTS, 0.0)
    plan = build_plan(scenario)
    for rank, result in enumerate(ranks):
        ops = plan.program_of(rank).ops
        busy, parts = dict.fromkeys(OP_CLASSES, 0.0), dict.fromkeys(PARTS, 0.0)
        # each op's mean over the steps the step time is the mean of (a runner without them: the last step)
        means = result.get("op_means") or timeline_seconds(result["timeline"])
        for op_id, seconds in means.items():
            busy[op_class(ops[int(op_id)])] += seconds
            # the simulator's parts; a pipeline receive (its wait included) counts as communication
            parts[part_of(ops[int(op_id)]) or "communication"] += seconds
        parts["idle"] = max(0.0, step_time - sum(parts.values()))
        for part in PARTS:
            totals[part] += parts[part] / len(ranks)
        out_ranks.append({"rank": rank, "program": plan.program_of(rank).name,
                          "bytes_sent": _per_step(result["bytes_sent"], steps),
                          "bytes_received": _per_step(result["bytes_received"], steps),
                          "offload_bytes": result["offload_bytes"] // steps, "memory": result["memory"],
                          "breakdown": parts, "op_time": busy, "op_mean_s": {str(k): v for k, v in means.items()},
                          "step_times_s": result["step_times"]})
    notes = ["time per op: ops run one after another here (no stream overlap); a pipeline "
             "receive's time includes waiting for the sender (the bubble); a data-parallel collective's time "
             "includes flattening and re-pointing its tensors (a calibrated profile prices that too)"]
    copies = [r["moe_copies"] for r in ranks if r.get("moe_copies")]
    if copies:
        routed, dropped = sum(c[0] for c in copies), sum(c[1] for c in copies)
        notes.append(f"MoE: {dropped:,} of {routed:,} token copies dropped past their expert's capacity "
                     f"({100 * dropped / routed:.1f} %) over the {steps} steps")
    if scenario.strategy.cp > 1:
        notes.append(f"context parallelism: the executor exchanges {scenario.strategy.cp_algo}'s blocks inside the "
                     "attention it computes, so their time is measured as forward and backward, not collectives")
    if collectives == "native":
        notes.append("collectives: the backend's own (--collectives native), whose traffic is not counted; "
                     "bytes sent and received are not measured")
    timelines = [{"program": plan.program_of(rank).name, "ranks": [rank], "ops": result["timeline"]}
                 for rank, result in enumerate(ranks)]  # the last step's, as the simulator's op_timeline
    return {"step_time_s": step_time, "breakdown": totals, "ranks": out_ranks, "links": [], "steps": steps,
            "losses": ranks[0]["losses"], "collectives": collectives, "notes": notes, "op_timeline": timelines}


def _error(sim: float, real: float | None) -> float | None:
    if real is None:
        return None
    if real == 0:
        return 0.0 if sim == 0 else None
    return (sim - real) / real


def _row(sim: float, real: float) -> dict:
    return {"sim": sim, "real": real, "error": _error(sim, real)}


def outside_ops(result: dict) -> float:
    """Seconds of the step in no op, mean over the ranks: the step less the time of every op class, at least 0.
    Measured, the executor's own work between ops (allocating, re-pointing, its bookkeeping: ZeRO-3 at 2 ranks
    7.8 ms of a 203 ms step); simulated, nothing where a calibrated profile prices that work in the compute
    that follows it (``OpCosts._turns``), so a compute reads over its measured time by as much."""
    ranks = result["ranks"]
    return sum(max(0.0, result["step_time_s"] - sum(r["op_time"].values())) for r in ranks) / len(ranks)


def comparison(sim: dict, real: dict) -> dict:
    """Relative errors: step time, mean time per op class, bytes per rank, memory per category (max)."""
    n = len(real["ranks"])
    pairs = list(zip(sim["ranks"], real["ranks"]))
    out = {"step_time_s": _row(sim["step_time_s"], real["step_time_s"]),
           "op_time_s": {kind: _row(sum(s["op_time"][kind] for s, _ in pairs) / n,
                                    sum(r["op_time"][kind] for _, r in pairs) / n) for kind in OP_CLASSES},
           "outside_ops_s": _row(outside_ops(sim), outside_ops(real)),
           "memory": {c: _row(max(s["memory"][c] for s, _ in pairs), max(r["memory"][c] for _, r in pairs))
                      for c in MEMORY_ROWS}}
    for key in ("bytes_sent", "bytes_received", "offload_bytes"):
        measured = None if any(r[key] is None for _, r in pairs) else max(r[key] for _, r in pairs)
        out[key] = {**_row(max(s[key] for s, _ in pairs), measured),
                    "ranks_equal": None if measured is None else sum(s[key] == r[key] for s, r in pairs), "ranks": n}
    return out
