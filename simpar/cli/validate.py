"""``simpar validate``: calibrated simulator against real runs, strategy by strategy."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from simpar import units
from simpar.cli.common import add_json_flag, write_json
from simpar.cli.calibrate import parse_worlds
from simpar.errors import SimparError


def register(sub) -> None:
    from simpar.validate import MODEL, STRATEGIES

    p = sub.add_parser("validate", help="simulated vs measured step time over strategies x ranks",
                       description=f"Runs each strategy for real ({MODEL} model, gloo ranks on this machine) and "
                                   "simulates it with the calibrated hardware profile; writes a markdown report, "
                                   "a CSV and a plot.")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated (default {','.join(STRATEGIES)}; pp runs 1F1B)")
    p.add_argument("--gpus", default="2,4,8", help="numbers of ranks (default 2,4,8)")
    p.add_argument("--hardware", help="hardware profile (default: this machine's, made by 'simpar calibrate' "
                                      "first if there is none)")
    p.add_argument("--steps", default="6",
                   help="training steps per run, at least (the first is a warm-up; default 6; --seconds may take more)")
    p.add_argument("--seconds", default="4",
                   help="each real run takes more steps than --steps where needed to last this long at the step "
                        "time the profile prices (default 4; 0: --steps exactly): this machine's speed flips "
                        "between states lasting seconds, and a short run draws one of them")
    p.add_argument("--repeats", default="1", help="real runs per case, their median compared (default 1; the "
                                                   "spread between runs is reported); taken in rounds, every "
                                                   "case once per round")
    p.add_argument("--calibrate-after", nargs="?", const="end", choices=("rounds", "end", "none"),
                   help="calibrate again among the runs (about 1.5 minutes a world size) and price the cases "
                        "with a profile of the runs' own window, on a machine whose state moves within an hour. "
                        "'rounds' (the default for a CPU profile): after each round of runs (--repeats of "
                        "them), saved beside the report as <out>.after-round<N>.json; 'end' (the flag alone): "
                        "once the runs are done, <out>.after.json; the cases are priced with the average of "
                        "those and the --hardware profile if it was saved within 10 minutes of the start (an "
                        "older one, such as a cached calibration of hours before, only sizes the runs); "
                        "'none': price with the --hardware profile as it is")
    p.add_argument("--timeout", default="600", help="seconds before a hung case is aborted (default 600)")
    p.add_argument("--save", metavar="FILE", help="also write the real runs and the profiles that priced them as "
                                                  "JSON, to be priced again later (simpar.validate.reprice)")
    p.add_argument("--out", default="validation.md", help="markdown report; .csv and .png beside it")
    p.add_argument("--published", nargs="?", const="", metavar="FILE",
                   help="instead: simulate the published measurements of real GPU runs (validation/published.json, "
                        "or FILE) and print simulated beside measured; sets A-C summarised, D apart")
    p.add_argument("--exact", action="store_true",
                   help="with --published: simulate every step in full (contention between overlapping transfers "
                        "included; minutes for the largest rows) instead of the fast path")
    add_json_flag(p, "{summary, cases} (with --published: also summary_groups, A-C and D, and summary_apart "
                     "for sets outside the referee)")
    p.set_defaults(handler=run)


def run_published(args) -> int:
    from tqdm import tqdm

    from simpar.published import GROUPS, REFEREE_SETS, load, run_case, summary

    cases = load(args.published or None)
    rows = [run_case(c, args.exact) for c in tqdm(cases, desc="published", unit="case", file=sys.stderr,
                                                  disable=None)]
    apart = sorted({r["set"] for r in rows} - set(REFEREE_SETS))
    result = {"summary": summary(rows), "summary_groups": {g: summary(rows, sets) for g, sets in GROUPS.items()},
              "summary_apart": {s: summary(rows, (s,)) for s in apart},
              "cases": [{k: r.get(k) for k in ("id", "set", "source", "quantity", "measured", "simulated", "error",
                                                  "skipped") if k in r} for r in rows]}
    if args.json and write_json(result, args.json):
        return 0
    for r in rows:
        if "skipped" in r:
            print(f"  {r['id']:<44} skipped: {r['skipped']}")
        else:
            print(f"  {r['id']:<44} {r['quantity']:<18} measured {r['measured']:>8.4g}  simulated "
                  f"{r['simulated']:>8.4g}  {100 * r['error']:+6.1f} %")
    groups = [(f"  {'sets' if len(sets) > 1 else 'set'} {g}", result["summary_groups"][g])
              for g, sets in GROUPS.items()]
    for label, s in [("sets " + "-".join((REFEREE_SETS[0], REFEREE_SETS[-1])), result["summary"])] + groups + \
            [(f"set {k} (reported apart)", v) for k, v in result["summary_apart"].items()]:
        if s["cases"]:
            print(f"{label}: {s['cases']} cases, mean |error| {100 * s['mean_abs_error']:.1f} %, "
                  f"max {100 * s['max_abs_error']:.1f} %, skipped {len(s['skipped'])}")
    return 0


def run(args) -> int:
    if args.published is not None:
        return run_published(args)
    if args.exact:
        raise SimparError("--exact: applies to --published (the executor runs are always measured in full)")
    from tqdm import tqdm

    from simpar.calibrate.profile import HardwareProfile
    from simpar.scenario import STRATEGY_NAMES
    from simpar.validate import BEFORE_WINDOW_S, Recalibrations, resolutions, run_cases, summary, write_report

    strategies = [s.strip().lower() for s in args.strategies.split(",") if s.strip()]
    for name in strategies:
        if name not in STRATEGY_NAMES:
            raise SimparError(f"--strategies: unknown {name!r}; choose from {', '.join(STRATEGY_NAMES)}")
    worlds = parse_worlds(args.gpus, "--gpus")
    steps = units.positive_int(args.steps, "--steps")
    timeout = units.positive(args.timeout, "--timeout")
    repeats = units.positive_int(args.repeats, "--repeats")
    seconds = units.non_negative(args.seconds, "--seconds")
    profile_path = args.hardware or str(ensure_profile("fp32"))
    profile = HardwareProfile.load(profile_path)
    cpu_ranks = isinstance(profile, HardwareProfile)
    if args.calibrate_after in ("rounds", "end") and not cpu_ranks:
        raise SimparError("--calibrate-after: calibrates CPU ranks; the --hardware profile is a GPU's (use none)")
    recalibrate = args.calibrate_after or ("rounds" if cpu_ranks else "none")
    lacking = [w for w in worlds if w >= 2 and str(w) not in profile.ring] if cpu_ranks else []
    if lacking and recalibrate == "none":
        print(f"warning: {profile_path} was not calibrated for {', '.join(map(str, lacking))} ranks; those cases are "
              f"priced with the nearest size's figures (simpar calibrate --gpus {','.join(map(str, worlds))})",
              file=sys.stderr)
    every_round = recalibrate == "rounds"
    out = Path(args.out)

    def save_as(index: int) -> str:
        return str(out.with_suffix(f".after-round{index + 1}.json" if every_round else ".after.json"))

    say = lambda message: print(f"calibrating among the runs: {message}", file=sys.stderr)  # noqa: E731
    fresh = time.time() - Path(profile_path).stat().st_mtime < BEFORE_WINDOW_S  # taken right before the runs
    later = (Recalibrations(profile, profile_path, "fp32", save_as, every_round, say, worlds=worlds,
                            before_in_window=fresh) if recalibrate != "none" else None)
    pairs = [(s, g) for s in strategies for g in worlds]
    record: dict = {}
    with tqdm(total=len(pairs) * repeats, desc="validating", unit="run", file=sys.stderr, disable=None) as bar:
        cases = run_cases(profile, pairs, "fp32", steps, timeout, repeats, progress=bar.update,
                          seconds=seconds,
                          after=later.priced if later else None, after_round=later.after_round if later else None, record=record)
    if args.save:
        from simpar.validate import save_runs

        save_runs(args.save, record, later.profiles(profile) if later else [profile])
    after_paths = [path for _, path in later.taken] if later else []
    result = summary(cases)
    if repeats > 1:  # how finely these runs and calibrations can judge any model (simpar/referee.py)
        from simpar.referee import whole

        result["resolution"] = resolutions(cases, later.profiles(profile) if later else [profile], "fp32")
        over_all = whole(result["resolution"])  # two world sizes or more: the goal over them all
        if over_all:
            result["resolution_whole"] = over_all
    before_too = not later or later.counts_before()
    files = write_report(out, profile_path, cases, result, after=", ".join(after_paths), before_too=before_too)
    if args.json and write_json({"summary": result, "cases": cases, "hardware": profile_path,
                                 "calibrated_after": after_paths or None}, args.json):
        return 0
    for c in cases:
        print(f"  {c['strategy']:<8}{c['gpus']:>3} ranks  simulated {units.human_time(c['sim_step_s']):>10}  "
              f"measured {units.human_time(c['real_step_s']):>10}  {100 * c['error']:+6.1f} %  "
              f"spread {100 * c['spread']:3.0f} %  "
              f"bytes {'exact' if c['bytes_exact'] else 'DIFFER'}")
    print(f"median |error| {100 * result['median_abs_error']:.1f} %, max {100 * result['max_abs_error']:.1f} %, "
          f"median run-to-run spread {100 * result['median_spread']:.1f} %, "
          f"bytes exact: {result['bytes_exact']}; report: {', '.join(str(f) for f in files)}")
    if result.get("resolution"):
        from simpar.referee import describe, describe_whole

        for world, found in result["resolution"].items():
            print(describe(world, found))
        if result.get("resolution_whole"):
            print(describe_whole(result["resolution_whole"]))
    if after_paths and before_too:
        print(f"priced with the average of {profile_path} and the calibrations among the runs, "
              f"{', '.join(after_paths)}")
    elif after_paths:
        why = (f"older than {BEFORE_WINDOW_S / 60:.0f} minutes" if not fresh else
               f"not calibrated for {', '.join(map(str, lacking))} ranks")
        print(f"priced with the calibrations among the runs, {', '.join(after_paths)} ({profile_path}, {why}, "
              "only sized the runs)")
    return 0


def ensure_profile(precision: str) -> Path:
    """This machine's cached profile, calibrating first if there is none or it is of an older version (whose
    terms this simpar would read differently)."""
    import json

    from simpar.calibrate import calibrate, default_path
    from simpar.calibrate.profile import VERSION

    path = default_path(precision)
    try:
        stale = path.exists() and json.loads(path.read_text()).get("version") != VERSION
    except (ValueError, AttributeError):  # not a profile: loading it says what is wrong with it
        stale = False
    if stale or not path.exists():
        why = "the hardware profile is of an older simpar" if stale else "no hardware profile for this machine yet"
        print(f"{why}: calibrating ({path})", file=sys.stderr)
        path.parent.mkdir(parents=True, exist_ok=True)
        calibrate(precision, progress=lambda m: print(f"calibrating: {m}", file=sys.stderr)).save(str(path))
    return path
