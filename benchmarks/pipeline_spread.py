"""A pipeline's step priced with its sends' holds at their mean and drawn from their spread, beside its runs.

    python benchmarks/pipeline_spread.py [--hardware PATH] [--gpus 2,4,8] [--runs 0] [--steps 40]

For validate's pp case (tiny-deep, 1F1B, 2 micro-batches a stage) at each world the profile (this machine's
cached one by default) has, prints the step the simulator gives with every send's hold at its mean (``draws=0``)
and as the mean of ``DRAWS`` draws from the hold's measured spread (simpar/spread.py), with the draws' SD; with
``--runs N`` also the median of N real runs of the executor and each price's error against it. Nothing is fitted:
the spread is the calibration's (every isend of ``pattern_worker``'s handoffs). On the forty-first stop
(2026-11-29), the averaged profile of the 14:28 window: 2 ranks 30.6 -> 30.8 ms, 4 ranks 71.0 -> 76.8, 8 ranks
191.8 -> 194.8, the window's runs 30.5, 75.2 and 190.7 ms (docs/calibration.md, "A pipeline's step is a max of
its sends' holds").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from simpar.calibrate import default_path
from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError
from simpar.sim import simulate
from simpar.spread import DRAWS
from simpar.strategies import build_plan
from simpar.validate import case_scenario


def prices(profile: HardwareProfile, world: int) -> tuple[float, float, float]:
    """(step at the means, mean of the draws, SD of the draws) of validate's pp case at ``world``, seconds."""
    scenario = case_scenario("pp", world, "fp32")
    topology, plan = profile.topology(world, "fp32"), build_plan(scenario)
    at_means = simulate(scenario, topology=topology, plan=plan, serial=True, draws=0).step_time_s
    drawn = simulate(scenario, topology=topology, plan=plan, serial=True)
    return at_means, drawn.step_time_s, statistics.pstdev(drawn.draw_steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", help="the profile (default: this machine's cached one)")
    parser.add_argument("--gpus", default="2,4,8", help="worlds, those the profile has (default 2,4,8)")
    parser.add_argument("--runs", type=int, default=0, help="real runs per world to set beside the prices")
    parser.add_argument("--steps", type=int, default=40, help="steps per real run")
    args = parser.parse_args()
    path = Path(args.hardware) if args.hardware else default_path("fp32")
    try:
        profile = HardwareProfile.load(str(path))
    except SimparError as error:
        print(f"pipeline_spread: {error}", file=sys.stderr)
        return 2
    if not profile.send_issue_spread:
        print(f"pipeline_spread: {path} has no measured spread (calibrated before the forty-first stop); "
              "run simpar calibrate", file=sys.stderr)
        return 2
    print(f"profile {path}; validate's pp case; {DRAWS} draws")
    for world in (int(w) for w in args.gpus.split(",")):
        if str(world) not in profile.ring:
            print(f"  {world} ranks: not in the profile")
            continue
        at_means, drawn, spread = prices(profile, world)
        line = (f"  {world} ranks: at the means {1e3 * at_means:7.2f} ms, drawn {1e3 * drawn:7.2f} ms "
                f"(SD of a draw {1e3 * spread:5.2f})")
        if args.runs:
            from simpar.real.compare import run_real  # torch: only when runs are asked for

            runs = [run_real(case_scenario("pp", world, "fp32"), args.steps, timeout=900)["step_time_s"]
                    for _ in range(args.runs)]
            real = statistics.median(runs)
            line += (f"; runs {', '.join(f'{1e3 * r:.1f}' for r in runs)} ms: at the means "
                     f"{100 * (at_means / real - 1):+.1f} %, drawn {100 * (drawn / real - 1):+.1f} %")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
