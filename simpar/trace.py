"""Chrome trace-event JSON (Perfetto, chrome://tracing) of a simulated and, beside it, a real step.

One process per rank ("sim rank 3", "real rank 3"), one thread per stream (compute, comm, send,
recv, copy, host), one slice per op named as the Plan names it; link utilisation (fraction of the
link's capacity in use) as counter tracks of a "sim links" process. Times are microseconds from the
start of the step. The format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json

from simpar.errors import SimparError
from simpar.plan import STREAMS, Plan, op_label

REAL_PID = 100_000  # real ranks' processes follow the simulated ones
LINKS_PID = 200_000
MAX_RANKS = 64  # beyond this, one rank per group of identical ranks (a 1,024-GPU trace stays openable)
MAX_LINKS = 16  # busiest links drawn as counters


def _process(pid: int, name: str, sort: int) -> list[dict]:
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}]


def _threads(pid: int) -> list[dict]:
    return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": i, "args": {"name": stream}}
            for i, stream in enumerate(STREAMS)]


def _slices(pid: int, ops: list[dict], plan_ops: list) -> list[dict]:
    return [{"ph": "X", "pid": pid, "tid": STREAMS.index(entry["stream"]), "name": op_label(plan_ops[entry["op"]]),
             "cat": entry["class"], "ts": 1e6 * entry["start"], "dur": 1e6 * (entry["end"] - entry["start"]),
             "args": {"op": entry["op"]}}
            for entry in ops]


def _ranks_to_draw(op_timeline: list[dict]) -> list[tuple[int, dict]]:
    every = [(rank, program) for program in op_timeline for rank in program["ranks"]]
    if len(every) <= MAX_RANKS:
        return sorted(every, key=lambda pair: pair[0])
    return [(program["ranks"][0], program) for program in op_timeline]


def step_events(op_timeline: list[dict], plan: Plan, source: str, pid_base: int) -> list[dict]:
    """Slices of every op of ``op_timeline`` (the simulator's or the executor's), per rank."""
    events = []
    for rank, program in _ranks_to_draw(op_timeline):
        pid = pid_base + rank
        events += _process(pid, f"{source} rank {rank} ({program['program']})", pid)
        events += _threads(pid)
        events += _slices(pid, program["ops"], plan.program_of(rank).ops)
    return events


def link_events(link_timeline: list[dict], busiest: list[dict]) -> list[dict]:
    """Utilisation counters of the busiest links (by bytes carried)."""
    chosen = {link["name"] for link in busiest[:MAX_LINKS]}
    events = _process(LINKS_PID, f"sim links (busiest {len(chosen)})", LINKS_PID)
    for link in link_timeline:
        if link["name"] not in chosen:
            continue
        events += [{"ph": "C", "pid": LINKS_PID, "name": f"{link['name']} ({link['kind']})", "ts": 1e6 * t,
                    "args": {"utilisation": round(u, 4)}} for t, u in link["points"]]
    return events


def build_trace(plan: Plan, sim: dict, real: dict | None = None, title: str = "") -> dict:
    """The trace of a run's JSON parts: ``sim`` needs op_timeline (and link_timeline for the
    counters), ``real`` (from --compare-real) its op_timeline."""
    if "op_timeline" not in sim:
        raise SimparError("--trace: the simulation has no op timeline")
    events = step_events(sim["op_timeline"], plan, "sim", 0)
    events += link_events(sim.get("link_timeline", []), sim.get("links", []))
    if real is not None:
        events += step_events(real["op_timeline"], plan, "real", REAL_PID)
    ranks = sum(len(p["ranks"]) for p in sim["op_timeline"])
    note = "" if ranks <= MAX_RANKS else f"{ranks} ranks: one per group of identical ranks drawn"
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "sim_step_time_s": sim["step_time_s"],
                          "real_step_time_s": None if real is None else real["step_time_s"], "note": note}}


def write_trace(path: str, trace: dict) -> None:
    try:
        with open(path, "w") as handle:
            json.dump(trace, handle)
    except OSError as exc:
        raise SimparError(f"--trace: cannot write {path!r}: {exc.strerror}") from None
