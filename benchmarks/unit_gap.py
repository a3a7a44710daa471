"""What a unit costs by the time since the same kind of unit last ran (calibrate/cold.py).

    python benchmarks/unit_gap.py [--models tiny,tiny-deep] [--pauses 0,2,5,10,20] [--steps 40] [--rounds 3]

The executor's own step (DDP on one rank, as ``simpar calibrate`` times units), with a pause before each step:
a bare Python loop (``spin``) or a sleep of so many milliseconds, which touches no memory of the model. Each
unit kind's forward and backward (mean over the steps after two, median over ``--rounds`` launches, the
pauses interleaved within a launch so the machine's drift falls on all alike) is printed beside its mean gap
since the last op of its kind and phase, and what the profile's ``unit_cold`` prices for that gap. A unit
that gets dearer with the pause alone pays for time away from its code and data, not for bytes touched.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simpar.calibrate.cold import GapClock, cold_share
from simpar.models import model
from simpar.real.launch import launch
from simpar.scenario import make_scenario

KINDS = (("embedding", "fwd"), ("layer", "fwd"), ("head", "fwd"), ("head", "bwd"), ("layer", "bwd"),
         ("embedding", "bwd"))


def _pause(how: str, ms: float) -> None:
    if how == "sleep":
        time.sleep(ms / 1e3)
        return
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def gap_worker(ctx, models: list[str], pauses: list[float], how: str, steps: int) -> dict:
    """{(model, pause): {(kind, phase): [mean seconds, mean gap]}} of the executor's one-rank steps (a layer's
    gap: the mean over its ops, the first of a step's after the step before, the others right after one)."""
    from simpar.real.executor import RankExecutor

    out = {}
    for name in models:
        spec = model(name)
        scenario = make_scenario(spec, "ddp", 1, micro_batch=1, precision="fp32", topology="cpu-host")
        executor = RankExecutor(ctx, scenario, seed=0)
        ops = executor.program.ops
        clock = GapClock()  # one clock: a unit's gap runs from the last of its kind, whichever pause's step
        seconds = {pause: {key: [] for key in KINDS} for pause in pauses}
        gaps = {pause: {key: [] for key in KINDS} for pause in pauses}
        try:
            for step in range(steps + 2):
                for pause in pauses:  # interleaved: every pause meets the same drift
                    _pause(how, pause)
                    executor.step(step)
                    t0, units = executor.recorder.step_started, []
                    for entry in executor.recorder.timeline:
                        op = ops[entry["op"]]
                        if getattr(op, "phase", None) in ("fwd", "bwd"):
                            units.append((spec.unit_kind(op.unit), op.phase, t0 + entry["start"], t0 + entry["end"]))
                    for (kind, phase, start, end), gap in zip(units, clock.add_step(units, keep=False)):
                        if step >= 2:
                            seconds[pause][(kind, phase)].append(end - start)
                            gaps[pause][(kind, phase)].append(gap)
        finally:
            executor.states.close()
        for pause in pauses:
            out[(name, pause)] = {key: [statistics.fmean(seconds[pause][key]), statistics.fmean(gaps[pause][key])]
                                  for key in KINDS}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,tiny-deep")
    parser.add_argument("--pauses", default="0,2,5,10,20", help="milliseconds before each step")
    parser.add_argument("--how", default="spin", choices=("spin", "sleep"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hardware", help="a profile whose unit_cold to print beside (default: this machine's)")
    args = parser.parse_args()
    models, pauses = args.models.split(","), [float(p) for p in args.pauses.split(",")]
    cold = _profile_cold(args.hardware)
    rounds = [launch(gap_worker, 1, (models, pauses, args.how, args.steps), timeout=1200)[0]
              for _ in range(args.rounds)]
    print(f"{args.how} before each step; us per op (median of {args.rounds} launches), mean gap since the last "
          "of its kind in ms" + ("; priced: the profile's cold share at that gap" if cold else ""))
    print(f"{'model':<10} {'pause':>5} " + " ".join(f"{k + ' ' + p:>16}" for k, p in KINDS))
    for name in models:
        for pause in pauses:
            cells = []
            for key in KINDS:
                us = statistics.median(r[(name, pause)][key][0] for r in rounds) * 1e6
                gap = statistics.median(r[(name, pause)][key][1] for r in rounds)
                priced = ""
                if cold and key[0] != "layer":
                    priced = f" {cold[0][key[1]][key[0]] * cold_share([gap], cold[1]) * 1e6:.0f}"
                cells.append(f"{us:.0f} @{gap * 1e3:.1f}{priced}")
            print(f"{name:<10} {pause:>5.0f} " + " ".join(f"{c:>16}" for c in cells))


def _profile_cold(path: str | None):
    """({phase: {kind: seconds}}, tau) of a profile's unit_cold, or None."""
    from pathlib import Path

    from simpar.calibrate import default_path
    from simpar.calibrate.profile import HardwareProfile

    where = Path(path) if path else default_path("fp32")
    if not where.exists():
        return None
    cold = HardwareProfile.load(str(where)).unit_cold.get("fp32")
    return ({phase: cold[phase] for phase in ("fwd", "bwd")}, cold["tau"]) if cold else None


if __name__ == "__main__":
    main()
