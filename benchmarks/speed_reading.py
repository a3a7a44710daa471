"""Does the spinners' reading of the host's speed follow the executor's step time? (simpar/real/host_speed.py)

    python benchmarks/speed_reading.py [--strategies ddp,tp] [--gpus 2] [--runs 8] [--seconds 4]

Runs each case (validate's: tiny-deep, fp32) ``--runs`` times back to back, each for about ``--seconds``
(the steps sized by a 3-step run of the case first), and prints every run's step time
beside how fast the cores ran over its timed steps (the spinners' loop: iterations per CPU second), then
per case the correlation of the step time with one over the speed, the slope of log step time against log
one-over-speed (1: the step goes as the speed), and the spread (SD / mean) of the step times raw and set at
one speed (each times its speed over the case's mean speed). Nothing is fitted: it tells how much of the
run-to-run spread the reading accounts for (docs/calibration.md, "The host's speed, read while the ranks
run").
"""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np

from simpar.validate import STRATEGIES, measure


def per_case(times: list[float], speeds: list[float]) -> dict:
    t, s = np.asarray(times), np.asarray(speeds)
    at_one_speed = t * s / s.mean()
    return {"corr": float(np.corrcoef(t, 1 / s)[0, 1]), "slope": float(np.polyfit(np.log(1 / s), np.log(t), 1)[0]),
            "spread_raw": float(t.std() / t.mean()), "spread_at_speed": float(at_one_speed.std() / at_one_speed.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="ddp,tp")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = set(strategies) - set(STRATEGIES)
    if unknown or args.runs < 3:
        parser.error(f"--strategies: choose from {','.join(STRATEGIES)}; --runs: 3 or more")
    for strategy in strategies:
        first = measure(strategy, args.gpus, "fp32", 3, 600.0)  # sizes the runs at this case's own step time
        steps = 1 + math.ceil(args.seconds / first["step_time_s"])
        times, speeds = [], []
        for run in range(args.runs):
            real = measure(strategy, args.gpus, "fp32", steps, 600.0)
            if real.get("host_speed") is None:
                raise SystemExit("no speed read: the spinners are off (SIMPAR_KEEP_AWAKE=0) or not on this OS")
            times.append(real["step_time_s"])
            speeds.append(real["host_speed"])
            print(f"{strategy} {args.gpus} ranks run {run + 1}: {1e3 * times[-1]:.2f} ms a step ({steps} steps), "
                  f"cores at {speeds[-1] / 1e6:.1f} M loop iterations per CPU second", flush=True)
        figures = per_case(times, speeds)
        print(f"{strategy}: corr(step, 1/speed) {figures['corr']:.2f}, slope {figures['slope']:.2f}, spread "
              f"{100 * figures['spread_raw']:.1f} % raw, {100 * figures['spread_at_speed']:.1f} % at one speed "
              f"(median step {1e3 * statistics.median(times):.2f} ms)\n", flush=True)


if __name__ == "__main__":
    main()
