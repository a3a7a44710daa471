"""Each op of a real step against its price, grouped by the compute before it (where a call's cost goes).

    python benchmarks/calls_in_step.py [--strategy tp] [--gpus 2] [--runs 4] [--steps 60] [--hardware PATH]
                                       [--by-place]

Runs validate's case of ``--strategy`` (tiny-deep, fp32) ``--runs`` times for ``--steps`` steps, takes every
rank's mean per op over the steps after the first (``op_mean_s``) and sets it beside the op's time in the
simulator's timeline on the profile (this machine's cached one by default). Calls are grouped by the op
before them in the Plan (the compute a call follows, or another call), computes by unit kind, piece and
phase; per group it prints the ops a step has, the priced and measured mean and the error. Nothing is fitted:
it shows which calls a profile prices short or long and after what (docs/calibration.md, "tp's calls after a
backward piece cost more than the short loop says"). With ``--by-place`` calls are grouped instead by the
phase of the compute before their series and their place in it: the first, the second to fourth, the fifth
on, and the last, the one a compute follows (at 2 ranks, 2026-11-28, ZeRO-3's last gathers cost 0.32-0.38 ms
more than its fifth-and-later ones, priced 0.23-0.30 more: ``series_last``).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from simpar.calibrate import default_path
from simpar.calibrate.profile import HardwareProfile
from simpar.plan import Collective, Compute, Copy, Recv, Send
from simpar.sim import simulate
from simpar.strategies import build_plan
from simpar.validate import case_scenario


def _compute_label(op: Compute, unit_kind) -> str:
    return f"{op.phase} {unit_kind(op.unit)}" + (f" {op.part}" if op.part else "")


def group_of(ops: list, index: int, unit_kind) -> str | None:
    """What ``ops[index]`` is reported under: a compute by its phase, unit kind and piece; a call or a
    point-to-point op by what comes before it ("after" a compute's label, or "after a call"); None for
    ops that take no time (memory bookkeeping)."""
    op = ops[index]
    if isinstance(op, Compute):
        return "compute " + _compute_label(op, unit_kind)
    if not isinstance(op, (Collective, Send, Recv)):
        return None
    before = next((o for o in reversed(ops[:index]) if isinstance(o, (Compute, Collective, Send, Recv))), None)
    kind = "call" if isinstance(op, Collective) else type(op).__name__.lower()
    if isinstance(before, Compute):
        return f"{kind} after {_compute_label(before, unit_kind)}"
    return f"{kind} after a call" if before is not None else f"{kind}, the step's first"


def place_of(ops: list, index: int, unit_kind) -> str | None:
    """``group_of``'s alternative: a call or point-to-point op by the phase of the compute before its series and
    its place in it ("1", "2-4", "5+", or "last" where a compute follows it), allocations aside."""
    op = ops[index]
    if not isinstance(op, (Collective, Send, Recv)):
        return group_of(ops, index, unit_kind)
    timed = [o for o in ops if isinstance(o, (Compute, Copy, Collective, Send, Recv))]
    at = next(i for i, o in enumerate(timed) if o is op)
    start = max((i for i in range(at) if isinstance(timed[i], (Compute, Copy))), default=-1)
    phase = "step's first" if start < 0 else timed[start].phase if isinstance(timed[start], Compute) else "a copy"
    position = at - start
    place = "1" if position == 1 else "2-4" if position <= 4 else "5+"
    if at + 1 < len(timed) and isinstance(timed[at + 1], Compute):
        place = "last"
    kind = op.op if isinstance(op, Collective) else type(op).__name__.lower()
    return f"{kind} after {phase}, {place}"


def grouped(measured: list[tuple[list, dict[int, float], dict[int, float]]], unit_kind,
            group=None) -> dict[str, dict]:
    """Per group: {"ops": a program's ops in it, "priced": mean seconds, "measured": mean seconds}, over
    ``measured``: one (the rank's program's ops, {op id: priced seconds}, {op id: measured seconds}) per rank
    and run; ops grouped by ``group`` (``group_of`` unless told)."""
    group_of_op = group or group_of
    rows: dict[str, list] = defaultdict(list)
    for ops, priced, means in measured:
        for op_id, seconds in means.items():
            group = group_of_op(ops, op_id, unit_kind)
            if group is not None:
                rows[group].append((priced.get(op_id, 0.0), seconds))
    return {group: {"ops": len(pairs) / len(measured), "priced": statistics.fmean(p for p, _ in pairs),
                    "measured": statistics.fmean(m for _, m in pairs)} for group, pairs in rows.items()}


def main() -> None:
    from simpar.real.compare import run_real

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="tp")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--hardware", help="the profile to price with (default: this machine's cached one)")
    parser.add_argument("--by-place", action="store_true", help="group calls by their place in their series")
    args = parser.parse_args()
    path = Path(args.hardware) if args.hardware else default_path("fp32")
    profile = HardwareProfile.load(str(path))
    scenario = case_scenario(args.strategy, args.gpus, "fp32")
    plan = build_plan(scenario)
    sim = simulate(scenario, topology=profile.topology(args.gpus, "fp32"), serial=True).to_json(ops=True)
    priced: dict[int, dict[int, float]] = {}  # rank -> op id -> seconds in the simulator's timeline
    for program in sim["op_timeline"]:
        seconds: dict[int, float] = defaultdict(float)
        for entry in program["ops"]:
            seconds[entry["op"]] += entry["end"] - entry["start"]
        priced.update({rank: seconds for rank in program["ranks"]})
    measured = []
    for run in range(args.runs):
        real = run_real(scenario, args.steps, timeout=600)
        measured += [(plan.program_of(r["rank"]).ops, priced[r["rank"]],
                      {int(op): seconds for op, seconds in r["op_mean_s"].items()}) for r in real["ranks"]]
        print(f"run {run + 1}: step {1e3 * real['step_time_s']:.1f} ms, priced {1e3 * sim['step_time_s']:.1f} ms")
    print(f"profile {path}; {args.strategy} on {args.gpus} ranks, {args.runs} runs of {args.steps} steps")
    by = place_of if args.by_place else group_of
    for group, row in sorted(grouped(measured, scenario.model.unit_kind, by).items()):
        error = (row["priced"] - row["measured"]) / row["measured"] if row["measured"] else float("nan")
        print(f"{group:<42} x{row['ops']:<4.1f} priced {1e6 * row['priced']:8.0f} us  "
              f"measured {1e6 * row['measured']:8.0f} us  {100 * error:+6.1f} %")


if __name__ == "__main__":
    main()
