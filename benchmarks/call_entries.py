"""Each data-parallel call of a real step split where the ranks enter it: the wait for the last rank, and the rest.

    python benchmarks/call_entries.py [--strategy zero1] [--gpus 4] [--steps 40] [--hardware PATH]

Runs validate's case of ``--strategy`` (tiny-deep, fp32) once for ``--steps`` steps and takes every rank's
start and end of every call on the machine's one monotonic clock (the executor's own timing, every step after the
first). Per call of the step it prints how far apart the ranks entered it (the spread, and the mean lag of a rank
behind the last one in), how long it took after the last one entered (each rank's end, averaged), and how far
apart they left it, beside the simulator's price on the profile (this machine's cached one by default) split the
same way: the wait (the wake and the curve's rise after the compute before it) and the rest (the ring's steps,
``later_steps`` and the executor's handling of the data). Nothing is fitted.

Why: at 4 ranks on 2 cores (forty-ninth stop, 2026-12-01, a script of the same timing, one launch of 40 steps
each, priced with a calibration of 23:39) zero1's reduce-scatter was
entered 11.0 ms apart (lag 5.4 ms) and took 11.1 ms after its last rank came, its all-gather after the optimizer
6.8 ms apart (lag 3.2) and 9.3 after, ddp's all-reduce 13.6 apart (lag 6.5) and 19.1 after, where the ring's steps
and the handling were priced 8.0, 7.2 and 14.2 ms: past the last entry the steps took 1.0-1.6 ms more each than
their price, as the calibration's own phase loops sat over theirs (``later_steps``, fitted at every world since).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from simpar.calibrate import default_path
from simpar.calibrate.fits import ring_price
from simpar.calibrate.profile import HardwareProfile
from simpar.plan import Collective


def timed_worker(ctx, strategy: str, steps: int) -> dict:
    """One rank's run of the case, with each op's (step, op id, start, end) in clock time."""
    from simpar.real import instrument
    from simpar.real.executor import run_rank
    from simpar.validate import case_scenario

    log = []
    plain = instrument.Recorder.time_op

    def time_op(self, op, started, until=None):
        plain(self, op, started, until)
        if self.timeline and self.timeline[-1]["op"] == op.id:
            log.append((len(self.step_times), op.id, started, self.timeline[-1]["end"] + self.step_started))

    instrument.Recorder.time_op = time_op  # (this rank's process only)
    out = run_rank(ctx, case_scenario(strategy, ctx.world, "fp32"), steps, 0)
    return {"log": log, "step_times": out["step_times"]}


def entries(logs: list[list[tuple]], op_id: int) -> list[tuple[float, float, float, float]]:
    """Per step after the first, for one op: (entry spread, mean lag behind the last entry, mean time after the
    last entry, exit spread), from every rank's log of (step, op id, start, end)."""
    by_rank = [{step: (a, b) for step, op, a, b in log if op == op_id and step >= 1} for log in logs]
    rows = []
    for step in sorted(set.intersection(*(set(r) for r in by_rank))):
        starts, ends = [r[step][0] for r in by_rank], [r[step][1] for r in by_rank]
        last = max(starts)
        rows.append((last - min(starts), statistics.fmean(last - s for s in starts),
                     statistics.fmean(e - last for e in ends), max(ends) - min(ends)))
    return rows


def main() -> None:
    from simpar.real.launch import launch
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan
    from simpar.validate import case_scenario

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="zero1")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hardware", help="the profile to price with (default: this machine's cached one)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: at least 2 (the first is left out)")
    path = Path(args.hardware) if args.hardware else default_path("fp32")
    scenario = case_scenario(args.strategy, args.gpus, "fp32")
    plan = build_plan(scenario)
    profile = HardwareProfile.load(str(path))
    costs = OpCosts(plan, scenario, profile.topology(args.gpus, "fp32"))
    alpha, bytes_per_s = profile.ring[str(args.gpus)]
    ranks = launch(timed_worker, args.gpus, (args.strategy, args.steps), timeout=900)
    step = max(statistics.fmean(r["step_times"][1:]) for r in ranks)
    print(f"{args.strategy} on {args.gpus} ranks, {args.steps} steps ({1e3 * step:.1f} ms a step); profile {path}")
    print("a call: entered apart (mean lag behind the last) | after the last entry | left apart || priced: the wait | "
          "the steps, their later stalls, the handling (ms)")
    for op in plan.programs[0].ops:
        if not isinstance(op, Collective) or op.group == "tp":
            continue
        rows = entries([r["log"] for r in ranks], op.id)
        spread, lag, after, left = (1e3 * statistics.fmean(row[i] for row in rows) for i in range(4))
        later, handling = costs.later_steps(op, costs.after_compute.get((0, op.id), 0.0)), costs.handling(op)
        wait = costs.wake(0, op) - later - handling  # (0 for a call after another: no wake, no later steps)
        ring = op.algo in (None, "ring")
        steps = ring_price(op.op, op.nbytes, args.gpus, alpha, bytes_per_s) if ring else float("nan")
        print(f"{op.op} ({op.algo or 'ring'}, {op.nbytes} B): {spread:.2f} ({lag:.2f}) | {after:.2f} | {left:.2f} || "
              f"{1e3 * wait:.2f} | {1e3 * steps:.2f}, {1e3 * later:.2f}, {1e3 * handling:.2f}")


if __name__ == "__main__":
    main()
