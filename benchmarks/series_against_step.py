"""The calibration's ZeRO-3 series against the executor's own step, in one launch, call by call by place.

    python benchmarks/series_against_step.py [--launches 3] [--seconds 3] [--steps 30]

Each launch (2 ranks, fp32) runs ``series_worker`` (calibrate/series.py: the executor's own ZeRO-3 calls after
a product burst, a forward's pattern and a backward's in turn) for ``--seconds``, then ``--steps`` of the
executor's ZeRO-3 step on tiny-deep. It prints the step time and, after a forward and after a backward, each
call's mean time by its place after the compute: the loop's, and the step's over its layers' series (each
rank's mean per op over the steps after the first). Nothing is fitted: it shows whether the loop the profile
is priced from reads what the step does in the same minutes (the machine drifts by tens of percent between
them). At 2 ranks, 2026-12-02, three launches (each burst as long as the executor's warm-up steps' layer forward
or backward): the reduce-scatter after a backward 1.99-2.25 ms in the loop, 1.77-1.95 in the step; the gathers'
mean after a backward 0.86-1.00 / 0.90-0.97 ms, after a forward 0.78-0.94 / 0.73-0.85 (docs/calibration.md,
fiftieth stop).
"""

from __future__ import annotations

import argparse
import statistics


def worker(ctx, seconds: float, steps: int) -> dict:
    from simpar.calibrate.series import series_scenario, series_worker
    from simpar.real.executor import RankExecutor, _train

    timed = series_worker(ctx, seconds)
    executor = RankExecutor(ctx, series_scenario(ctx.world, "fp32"), seed=0)
    try:
        run = _train(ctx, executor, steps)
    finally:
        executor.states.close()
    return {"series": timed["series"], "series_bwd": timed["series_bwd"], "op_means": run["op_means"],
            "step_times": run["step_times"], "compute": [timed["compute"], timed["compute_bwd"]]}


def step_places(ops: list, op_means: dict, unit_kind, phase: str) -> list[float]:
    """The mean time of the calls after each layer's ``phase`` compute, by their place after it (the first call
    after the compute, the second, ...), from one rank's ``op_means`` (op id -> seconds)."""
    from simpar.plan import Collective, Compute

    places: dict[int, list[float]] = {}
    place, counted = 0, False
    for op in ops:
        if isinstance(op, Compute):
            place, counted = 0, op.phase == phase and unit_kind(op.unit) == "layer"
        elif isinstance(op, Collective):
            place += 1
            if counted and op.id in op_means:
                places.setdefault(place, []).append(op_means[op.id])
    return [statistics.fmean(places[p]) for p in sorted(places)]


def main() -> None:
    from simpar.calibrate.series import series_positions, series_scenario
    from simpar.real.launch import launch
    from simpar.strategies import build_plan

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long the series loop runs")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    scenario = series_scenario(2, "fp32")
    plan = build_plan(scenario)

    def row(name: str, times: list[float]) -> str:
        places = " ".join(f"{1e3 * t:5.2f}" for t in times)
        return f"  {name:<18}{places} | mean {1e3 * statistics.fmean(times):.3f}"

    for _ in range(args.launches):
        ranks = launch(worker, 2, (args.seconds, args.steps), timeout=900)
        step = max(statistics.fmean(r["step_times"][1:]) for r in ranks)
        bursts = [statistics.fmean(r["compute"][i] for r in ranks) for i in (0, 1)]
        print(f"step {1e3 * step:.1f} ms; the loop's bursts {1e3 * bursts[0]:.2f} / {1e3 * bursts[1]:.2f} ms "
              "(after a forward / a backward); calls by place (ms):")
        for phase, key in (("fwd", "series"), ("bwd", "series_bwd")):
            per_rank = [step_places(plan.program_of(rank).ops, r["op_means"], scenario.model.unit_kind, phase)
                        for rank, r in enumerate(ranks)]
            print(row(f"after {phase}, loop", series_positions([r[key] for r in ranks])))
            print(row(f"after {phase}, step", [statistics.fmean(p) for p in zip(*per_rank)]), flush=True)


if __name__ == "__main__":
    main()
