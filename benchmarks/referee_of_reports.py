"""What earlier `simpar validate` windows could judge: their runs' and calibrations' noise, pooled.

    python benchmarks/referee_of_reports.py R1.json [R2.json ...] [--gpus 2 | --whole]

Each R is a validate report written with ``--json`` beside its ``<out>.after-round<N>.json`` calibrations
(``--calibrate-after rounds``). Prints, per report and pooled over them all, what ``simpar/referee.py``
reads: the spread of one run and of one calibration's price, and the chance that a model without error
meets the 2-rank goal with 3, 6 and 9 runs a case (a calibration a round). Every case is priced again with
this simpar, so the prices are of today's model, the runs as measured. With ``--whole``, each report's
cases of every world size are read against the goal over them all (``referee.whole``: every case within
max(15 %, its spread), the median within 10 %).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simpar.calibrate.profile import HardwareProfile
from simpar.referee import describe_whole, pass_chance, pooled_sd, resolution, whole
from simpar.validate import price


def report_groups(path: Path, gpus: int) -> tuple[list[list[float]], list[list[float]]]:
    """(each case's run times, each case's price by each calibration of its window) of one report."""
    data = json.loads(path.read_text())
    profiles = [HardwareProfile.load(str(path.parent / Path(p).name)) for p in data.get("calibrated_after") or []]
    cases = [c for c in data["cases"] if c["gpus"] == gpus]
    return ([c["real_runs_s"] for c in cases],
            [[price(p, c["strategy"], gpus, "fp32") for p in profiles] for c in cases])


def whole_line(path: Path) -> str:
    """What one report's whole window (every world size in it) allows against the goal over them all."""
    worlds = sorted({c["gpus"] for c in json.loads(path.read_text())["cases"]})
    found = {w: resolution(*report_groups(path, w)) for w in worlds}
    over = whole({w: r for w, r in found.items() if r})
    return f"{path}: " + (describe_whole(over) if over else "one world size or one run a case: nothing to read")


def line(label: str, runs: list[list[float]], prices: list[list[float]], cases: int) -> str:
    run_sd, price_sd = pooled_sd(runs), pooled_sd(prices)
    if run_sd is None:
        return f"{label}: one run a case, no spread to read"
    chances = [f"{n} runs {100 * pass_chance(run_sd, n, cases, price_sd or 0.0, n):.0f} %" for n in (3, 6, 9)]
    exact = 100 * pass_chance(run_sd, 3, cases)
    return (f"{label}: run SD {100 * run_sd:.1f} %, calibration SD "
            + (f"{100 * price_sd:.1f} %" if price_sd is not None else "-")
            + f"; no-error model meets the goal: exact price, 3 runs {exact:.0f} %; calibrated, " + ", ".join(chances))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--whole", action="store_true", help="every world size of each report, the goal over all")
    args = parser.parse_args(argv)
    if args.whole:
        for path in args.reports:
            print(whole_line(path))
        return 0
    all_runs, all_prices, cases = [], [], 0
    for path in args.reports:
        runs, prices = report_groups(path, args.gpus)
        cases = max(cases, len(runs))
        print(line(str(path), runs, prices, len(runs)))
        all_runs += runs
        all_prices += prices
    print(line(f"pooled over {len(args.reports)} reports", all_runs, all_prices, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
