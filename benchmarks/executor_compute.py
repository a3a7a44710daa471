"""Compute per unit: the calibrated profile against the executor's own forward and backward.

    python benchmarks/executor_compute.py [--models tiny-deep,small] [--batches 1,2,4] [--gpus 2] [--repeats 3]
                                          [--strategy ddp|tp] [--steps 40] [--hardware PATH]

Target (issue 16): each kind of unit's forward and backward within 10 % of what the executor
measures inside a real step, at micro-batches 1-4, for tiny-deep and small. Runs DDP (or tp: its
pieces of a layer, attention and MLP, each timed as one op) for real (``--repeats`` runs of ``--steps``
steps each, each op's mean over the steps after the first, every rank), takes the mean time per unit
kind (embedding, layer, head) and phase, and prints it beside what the simulator prices with this
machine's profile (``simpar calibrate`` first if there is none). Nothing here is fitted: the
profile comes from micro-benchmarks alone.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from simpar.calibrate import calibrate, default_path
from simpar.calibrate.profile import HardwareProfile
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.strategies import build_plan


def per_unit(timelines: list[dict], plan, spec) -> dict[tuple[str, str], float]:
    """Mean seconds per (unit kind, phase) over every rank's timeline (the simulator's op_timeline)."""
    seconds = defaultdict(list)
    for timeline in timelines:
        ops = plan.program_of(timeline["ranks"][0]).ops
        for entry in timeline["ops"]:
            op = ops[entry["op"]]
            if getattr(op, "phase", None) in ("fwd", "bwd"):
                seconds[(spec.unit_kind(op.unit), op.phase)].append(entry["end"] - entry["start"])
    return {key: statistics.fmean(values) for key, values in seconds.items()}


def measured_per_unit(real: dict, plan, spec) -> dict[tuple[str, str], float]:
    """Mean seconds per (unit kind, phase) of a real run: each op's mean over the run's steps after the first
    (``op_mean_s``), over every rank, not its last step alone."""
    seconds = defaultdict(list)
    for rank in real["ranks"]:
        ops = plan.program_of(rank["rank"]).ops
        for op_id, mean in rank["op_mean_s"].items():
            op = ops[int(op_id)]
            if getattr(op, "phase", None) in ("fwd", "bwd"):
                seconds[(spec.unit_kind(op.unit), op.phase)].append(mean)
    return {key: statistics.fmean(values) for key, values in seconds.items()}


def main() -> None:
    from simpar.real.compare import run_real

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-deep,small")
    parser.add_argument("--batches", default="1,2,4")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategy", default="ddp", choices=("ddp", "tp"))
    parser.add_argument("--steps", type=int, default=40,
                        help="steps a run (each op's mean over those after the first; default 40: this VM's "
                             "speed flips for seconds at a time, and a few steps draw one state)")
    parser.add_argument("--hardware", help="the profile to price with (default: this machine's cached one)")
    args = parser.parse_args()
    path = Path(args.hardware) if args.hardware else default_path("fp32")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        calibrate("fp32").save(str(path))
    profile = HardwareProfile.load(str(path))
    errors = []
    print(f"profile {path}; {args.strategy} on {args.gpus} ranks, {args.repeats} runs per case")
    print(f"{'model':<10} {'b':>2} {'unit':<9} {'phase':<4} {'simulated':>10} {'measured':>10} {'error':>8}")
    for name in args.models.split(","):
        spec = model(name)
        for b in (int(x) for x in args.batches.split(",")):
            scenario = make_scenario(spec, args.strategy, args.gpus, micro_batch=b, precision="fp32", topology="cpu-host")
            plan = build_plan(scenario)
            topology = profile.topology(args.gpus, "fp32")
            # the executor's op timer leaves out its own work between ops, which the simulator charges to the
            # compute after it (``between_ops``, 13 us an op): priced without it, the same thing is compared
            topology.between_ops = 0.0
            sim = simulate(scenario, topology=topology, serial=True).to_json(ops=True)
            simulated = per_unit(sim["op_timeline"], plan, spec)
            runs = [measured_per_unit(run_real(scenario, args.steps, timeout=600), plan, spec)
                    for _ in range(args.repeats)]
            for key in sorted(simulated):
                measured = statistics.median(run[key] for run in runs)
                error = (simulated[key] - measured) / measured
                errors.append(abs(error))
                print(f"{name:<10} {b:>2} {key[0]:<9} {key[1]:<4} {1e6 * simulated[key]:>8.0f}us "
                      f"{1e6 * measured:>8.0f}us {100 * error:>+7.1f}%")
    print(f"median |error| {100 * statistics.median(errors):.1f} %, max {100 * max(errors):.1f} %, "
          f"within 10 %: {sum(e <= 0.10 for e in errors)}/{len(errors)}")


if __name__ == "__main__":
    main()
