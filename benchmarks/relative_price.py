"""Does the price get the strategies' differences right? Each case against a base case run beside it.

    python benchmarks/relative_price.py [--gpus 2] [--strategies ddp,zero1,zero2,zero3] [--base ddp]
                                        [--rounds 10] [--steps 6] [--seconds 4] [--hardware PATH]

The development VM's speed moves by tens of percent over minutes for every case at once
(docs/calibration.md), so one case's error against a calibration taken minutes away is mostly the
machine's level, whichever way it went. Run back to back, two cases meet nearly the same level: the
ratio of their step times cancels it, and so does the ratio of their prices. So this runs every case
once a round, the order rotated each round (each case takes every place in turn: a case right after a
launch, or always last, is not favoured), and prints per case its measured step time over the base
case's of the same round (mean, SD and standard error over the rounds) beside the same ratio priced
by ``--hardware`` (default: this machine's cached calibration), and the relative error, the priced
ratio over the measured one minus 1. A strategy whose relative error stays beyond two standard errors
of zero has a mechanism of its own the price misses; one within them is priced like the base, and
whatever it misses in a validate window, the base misses too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from simpar.calibrate import default_path
from simpar.calibrate.profile import HardwareProfile
from simpar.validate import measure, price, run_steps


def rotated(strategies: list[str], round_: int) -> list[str]:
    """The order of round ``round_``: the list turned by one place each round."""
    k = round_ % len(strategies)
    return strategies[k:] + strategies[:k]


def relative(runs: dict[str, list[float]], prices: dict[str, float], base: str) -> dict[str, dict]:
    """Per strategy: its measured step over the base's, round by round (``runs`` in round order), their mean,
    SD and standard error, the priced ratio, and the relative error (priced ratio / mean measured ratio - 1)
    with its standard error (that of the measured mean, carried through the division)."""
    out = {}
    for strategy, times in runs.items():
        ratios = [t / b for t, b in zip(times, runs[base])]
        mean = statistics.fmean(ratios)
        sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        se = sd / len(ratios) ** 0.5
        priced = prices[strategy] / prices[base]
        out[strategy] = {"ratios": ratios, "mean": mean, "sd": sd, "se": se, "priced": priced,
                         "error": priced / mean - 1, "error_se": priced * se / mean ** 2}
    return out


def report(rows: dict[str, dict], base: str) -> list[str]:
    lines = [f"| strategy | measured / {base} (mean, SD) | priced / {base} | relative error (+- 2 SE) | "
             "rounds the price is under |", "| --- | ---: | ---: | ---: | ---: |"]
    for strategy, row in rows.items():
        if strategy == base:
            continue
        under = sum(row["priced"] < r for r in row["ratios"])
        lines.append(f"| {strategy} | {row['mean']:.3f} ({row['sd']:.3f}) | {row['priced']:.3f} | "
                     f"{row['error']:+.1%} (+- {2 * row['error_se']:.1%}) | {under}/{len(row['ratios'])} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--strategies", default="ddp,zero1,zero2,zero3")
    parser.add_argument("--base", default="ddp", help="the case every other is set against (one of --strategies)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0, help="each run lasts this long at least (0: --steps)")
    parser.add_argument("--hardware", default="", help="the profile to price with (default: this machine's cached one)")
    args = parser.parse_args(argv)
    strategies = args.strategies.split(",")
    if args.base not in strategies:
        parser.error(f"--base: {args.base!r} is not one of --strategies ({args.strategies})")
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (a spread needs two)")
    path = args.hardware or str(default_path("fp32"))
    if not Path(path).exists():
        parser.error(f"--hardware: no profile at {path}; run 'simpar calibrate' first")
    profile = HardwareProfile.load(path)
    prices = {s: price(profile, s, args.gpus, "fp32") for s in strategies}
    steps = {s: run_steps(profile, s, args.gpus, "fp32", args.steps, args.seconds) for s in strategies}
    runs: dict[str, list[float]] = {s: [] for s in strategies}
    began = time.monotonic()
    for round_ in range(args.rounds):
        for strategy in rotated(strategies, round_):
            runs[strategy].append(measure(strategy, args.gpus, "fp32", steps[strategy], 600)["step_time_s"])
        print(f"round {round_ + 1}/{args.rounds} done at {time.monotonic() - began:.0f} s", file=sys.stderr)
    print(f"{args.gpus} ranks, {args.rounds} rounds, priced with {path}\n")
    print("\n".join(report(relative(runs, prices, args.base), args.base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
