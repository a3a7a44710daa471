"""How close can any model come to this machine's measured step times? The noise floor of `simpar validate`.

    python benchmarks/noise_floor.py [--gpus 2] [--rounds 9] [--strategies ddp,dp,...] [--hardware P1,P2]
                                     [--steps 6] [--seconds 4]

Runs every case (validate's: tiny-deep, fp32) ``rounds`` times, in rounds as validate does, and
prints per case every measured step time, their pooled median and spread, and how far validate's
figure (the median of 3 consecutive runs) lands from the pooled median: the error of an oracle
that predicted each case's long-run median exactly. If the oracle misses 10 % in some windows, no
model can hold every case within 10 % there. A second oracle also knows each window's level (the
median over the cases of their window medians against their pooled ones): the machine's speed drifts
over minutes for every case at once, which calibrations taken among the runs can follow, so what it
misses is the noise of each case alone, the part no pricing of the window can follow. With
``--hardware`` it also prices each case with each calibrated profile (calibrations taken at different
hours) against the pooled median. Each run lasts ``--seconds`` as validate's do (``run_steps``: priced
with the first --hardware profile, else this machine's cached one; without either, ``--steps``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from simpar.calibrate import default_path
from simpar.calibrate.profile import HardwareProfile
from simpar.sim import simulate
from simpar.validate import STRATEGIES, case_scenario, measure, run_steps

WINDOW = 3  # runs per validate case (--repeats 3)
TARGET = 0.10


def window_ratios(runs: dict[str, list[float]]) -> list[dict[str, float]]:
    """Window by window (``WINDOW`` consecutive rounds), each case's median of its runs against its pooled median."""
    windows = len(next(iter(runs.values()))) - WINDOW + 1
    pooled = {s: statistics.median(times) for s, times in runs.items()}
    return [{s: statistics.median(times[i:i + WINDOW]) / pooled[s] for s, times in runs.items()}
            for i in range(windows)]


def oracle_report(runs: dict[str, list[float]]) -> list[str]:
    """The table and summary lines for ``runs`` (strategy -> measured step times, in round order)."""
    ratios = window_ratios(runs)
    windows = len(ratios)
    errors = {}  # strategy -> the oracle's error of each window's median of 3
    lines = ["| strategy | runs (ms, in order) | pooled median | spread | oracle error of a median of 3: worst | "
             f"windows within {TARGET:.0%} |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for strategy, times in runs.items():
        pooled = statistics.median(times)
        errors[strategy] = [window[strategy] - 1 for window in ratios]
        ok = sum(abs(e) <= TARGET for e in errors[strategy])
        lines.append(f"| {strategy} | {' '.join(f'{1e3 * t:.1f}' for t in times)} | {1e3 * pooled:.1f} | "
                     f"{(max(times) - min(times)) / pooled:.0%} | {max(errors[strategy], key=abs):+.1%} | "
                     f"{ok}/{windows} |")
    every = sum(all(abs(e[i]) <= TARGET for e in errors.values()) for i in range(windows))
    medians = [statistics.median(abs(e[i]) for e in errors.values()) for i in range(windows)]
    lines += ["", f"windows in which the oracle holds every case within {TARGET:.0%}: {every}/{windows}",
              "the oracle's median |error| over the cases, window by window: "
              + " ".join(f"{m:.1%}" for m in medians)]
    return lines


def level_oracle(runs: dict[str, list[float]]) -> tuple[list[dict[str, float]], list[str]]:
    """The oracle that also knows each window's level: per window, each case's median of ``WINDOW`` runs
    against its pooled median, divided by the window's level (the median of those ratios over the cases),
    minus 1. Returns (the errors window by window, the summary lines)."""
    errors = []
    for ratios in window_ratios(runs):
        level = statistics.median(ratios.values())
        errors.append({s: r / level - 1 for s, r in ratios.items()})
    every = sum(all(abs(e) <= TARGET for e in window.values()) for window in errors)
    lines = [f"windows in which the oracle that also knows the window's level holds every case within {TARGET:.0%}: "
             f"{every}/{len(errors)}; its worst |error| window by window: "
             + " ".join(f"{max(abs(e) for e in window.values()):.1%}" for window in errors)]
    return errors, lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0, help="each run lasts this long at least (0: --steps)")
    parser.add_argument("--hardware", default="", help="comma-separated profiles to price each case with")
    args = parser.parse_args(argv)
    if args.rounds < WINDOW:
        parser.error(f"--rounds: at least {WINDOW}")
    strategies = args.strategies.split(",")
    sizing = (args.hardware.split(",")[0] if args.hardware else "") or str(default_path("fp32"))
    profile = HardwareProfile.load(sizing) if args.seconds and Path(sizing).exists() else None
    steps = {s: run_steps(profile, s, args.gpus, "fp32", args.steps, args.seconds) for s in strategies}
    runs: dict[str, list[float]] = {s: [] for s in strategies}
    began = time.monotonic()
    for round_ in range(args.rounds):
        for strategy in strategies:
            runs[strategy].append(measure(strategy, args.gpus, "fp32", steps[strategy], 600)["step_time_s"])
        print(f"round {round_ + 1}/{args.rounds} done at {time.monotonic() - began:.0f} s", file=sys.stderr)
    print(f"{args.gpus} ranks, {args.rounds} rounds, steps a run: "
          + ", ".join(f"{s} {n}" for s, n in steps.items()) + "; oracle = the pooled median\n")
    print("\n".join(oracle_report(runs) + level_oracle(runs)[1]))
    for path in filter(None, args.hardware.split(",")):
        profile = HardwareProfile.load(path)
        topology = profile.topology(args.gpus, "fp32")
        cells = []
        for strategy in strategies:
            sim = simulate(case_scenario(strategy, args.gpus, "fp32"), topology=topology, serial=True).step_time_s
            cells.append(f"{strategy} {1e3 * sim:.1f} ms ({sim / statistics.median(runs[strategy]) - 1:+.0%})")
        print(f"{path}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
