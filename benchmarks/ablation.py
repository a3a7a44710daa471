"""Which terms of the CPU profile earn their place: the runs a ``simpar validate --save`` recorded, priced again
with each term taken out, against the noise of those runs (``simpar/referee.py``).

    python benchmarks/ablation.py RUNS.json [--greedy] [--json OUT]

Each row: the term, and the median / max |error| over the recorded cases without it (the rest as calibrated).
``--greedy`` then takes terms out one at a time, each time the one whose loss is least felt, while the median
and the max stay within the noise of the full model's: what is left is the smallest model these runs can tell
apart. ``--without a,b`` starts from the model without those terms.
"""

from __future__ import annotations

import argparse
import json
import statistics

from simpar.calibrate.ablate import TERMS, without
from simpar.calibrate.average import average_profiles
from simpar.calibrate.profile import HardwareProfile
from simpar.referee import pooled_sd, window_noise
from simpar.validate import load_runs, reprice


def scores(cases: list[dict]) -> tuple[float, float]:
    errors = [abs(c["error"]) for c in cases]
    return statistics.median(errors), max(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="a validate --save file")
    parser.add_argument("--greedy", action="store_true", help="take terms out while the error stays in the noise")
    parser.add_argument("--without", default="", help="comma-separated terms out of the model from the start")
    parser.add_argument("--json", help="write the table as JSON here")
    args = parser.parse_args()
    saved = load_runs(args.runs)
    profiles = [HardwareProfile(**p) for p in saved["profiles"]]
    profile = profiles[0] if len(profiles) == 1 else average_profiles(profiles, [""] * len(profiles), common=True)
    runs = [c["runs"] for c in saved["cases"]]
    run_sd = pooled_sd([[r["step_time_s"] for r in case] for case in runs])
    noise = window_noise(run_sd, min(map(len, runs)), len(runs))
    full = scores(reprice(saved, profile))
    print(f"{len(runs)} cases, one run spreading by {100 * run_sd:.1f} % (SD): the median |error| moves by "
          f"{100 * noise[0]:.1f} %, the max by {100 * noise[1]:.1f} % (SD) with the runs' noise alone")
    print(f"{'all terms':<22} median {100 * full[0]:5.1f} %  max {100 * full[1]:5.1f} %")
    start = [t for t in args.without.split(",") if t]
    rows = [{"term": term, **dict(zip(("median", "max"), scores(reprice(saved, without(profile, start + [term])))))}
            for term in TERMS if term not in start]
    for row in rows:
        print(f"{'without ' + row['term']:<26} median {100 * row['median']:5.1f} %  max {100 * row['max']:5.1f} %")
    out = {"noise": noise, "full": full, "start": start, "rows": rows}
    if args.greedy:
        gone, left = list(start), [r["term"] for r in rows]
        while left:
            tried = {t: scores(reprice(saved, without(profile, gone + [t]))) for t in left}
            # how close each removal comes to the noise's bound, the nearer of the median's and the max's
            term = min(tried, key=lambda t: max(tried[t][0] - full[0] - noise[0], tried[t][1] - full[1] - noise[1]))
            median, top = tried[term]
            if median > full[0] + noise[0] or top > full[1] + noise[1]:
                break
            gone.append(term)
            left.remove(term)
            print(f"out: {term:<22} median {100 * median:5.1f} %  max {100 * top:5.1f} %")
        out["out"] = gone
        print("kept:", ", ".join(t for t in TERMS if t not in gone))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
