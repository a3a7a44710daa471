"""``simpar validate``: the simulator, priced with a calibrated profile, against real runs of whole
strategies that the calibration never saw; a markdown + CSV report and a plot.

Per case (strategy x ranks): simulated and measured step time with the relative error
(simulated - measured) / measured, whether every rank's bytes matched exactly, whether every
rank's model-state memory matched. With ``repeats`` > 1 each case runs that many times and the
median is compared; the run-to-run spread (max - min) / median is reported beside the error, since
on a shared machine it bounds the error any model could reach.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from simpar.models import model
from simpar.plan import OP_CLASSES
from simpar.scenario import make_scenario
from simpar.sim import simulate

STRATEGIES = ("ddp", "dp", "zero1", "zero2", "zero3", "pp", "tp")
MODEL = "tiny-deep"
MAX_STEPS = 500  # a run's length by time stops here (a profile that prices a step at a millisecond)
# a profile saved this long before a validate starts was taken right before its runs, in their window (an
# older one is of another state of the machine)
BEFORE_WINDOW_S = 600.0


def case_scenario(strategy: str, gpus: int, precision: str):
    """pp runs 1F1B with 2 micro-batches per stage; the others one micro-batch of 2 sequences."""
    microbatches = 2 * gpus if strategy == "pp" else 1
    return make_scenario(model(MODEL), strategy, gpus, micro_batch=2, microbatches=microbatches,
                         precision=precision, topology="cpu-host")


def measure(strategy: str, gpus: int, precision: str, steps: int, timeout: float) -> dict:
    """One real run of a case (the executor, ``steps`` steps)."""
    from simpar.real.compare import run_real  # torch: only when a case runs

    return run_real(case_scenario(strategy, gpus, precision), steps, timeout=timeout)


def run_steps(profile, strategy: str, gpus: int, precision: str, steps: int, seconds: float) -> int:
    """Steps of one real run of a case: ``steps``, or more, enough for the run to last ``seconds`` after its
    warm-up step at the step time ``profile`` prices. A shared VM's speed can flip between a fast and a slow
    state for seconds at a time, so a run of a fraction of a second draws one state (dp at 2 ranks: launches
    of 0.2 s spread by SD/mean 28 %, of 4.5 s by 10 %, their medians alike). The price only sets how long the
    run is, never what it is compared with."""
    if not seconds or profile is None:
        return steps
    predicted = price(profile, strategy, gpus, precision)
    return min(max(steps, 1 + math.ceil(seconds / predicted)), MAX_STEPS)


def lower_median(values: list[float]) -> float:
    """The median of ``values``, the lower of the two middle ones if their number is even: one of them."""
    return sorted(values)[(len(values) - 1) // 2]


def judge(profile, strategy: str, gpus: int, precision: str, runs: list[dict]) -> dict:
    """One case: ``profile`` (a HardwareProfile) prices it; ``runs`` are its real runs, the median compared."""
    from simpar.real.compare import comparison

    scenario = case_scenario(strategy, gpus, precision)
    sim = simulate(scenario, topology=profile.topology(gpus, precision), serial=True).to_json()
    times = [r["step_time_s"] for r in runs]
    real = runs[times.index(lower_median(times))]  # the median run
    c = comparison(sim, real)
    bytes_exact = all(c[k]["ranks_equal"] == c[k]["ranks"] for k in ("bytes_sent", "bytes_received", "offload_bytes"))
    memory_exact = all(s["memory"][k] == r["memory"][k] for s, r in zip(sim["ranks"], real["ranks"])
                       for k in ("params", "grads", "optimizer"))
    return {"strategy": strategy, "gpus": gpus, "sim_step_s": sim["step_time_s"], "real_step_s": real["step_time_s"],
            "error": c["step_time_s"]["error"], "bytes_exact": bytes_exact, "memory_exact": memory_exact,
            "real_runs_s": times, "spread": (max(times) - min(times)) / real["step_time_s"],
            "real_steps_s": real["ranks"][0]["step_times_s"], "steps": real.get("steps"),
            # where the step's time went, priced and measured (the median run's mean per rank and step), so a
            # miss can be traced to an op class
            "op_time_s": {kind: [row["sim"], row["real"]] for kind, row in c["op_time_s"].items()}}


def run_cases(profile, pairs: list[tuple[str, int]], precision: str, steps: int, timeout: float,
              repeats: int = 1, progress=None, after=None, seconds: float = 0.0,
              after_round=None, record: dict | None = None) -> list[dict]:
    """Every (strategy, ranks) case of ``pairs``, ``repeats`` real runs each, in rounds (every case once,
    then every case again): this machine's speed drifts by tens of percent over minutes, and rounds spread a drift over every case instead of loading it on one.
    ``after_round(index, last)``, if given, is called after each round (``Recalibrations.after_round``:
    a calibration then); ``after(profile)``, if given, once the runs are done, returns the profile to
    price them with (``Recalibrations.priced``: a profile of the runs' window).
    Each run lasts at least ``seconds`` (``run_steps``). ``progress()`` is called after each run. ``record``,
    if given, is filled with (strategy, ranks) -> the case's real runs, as measured (``save_runs``)."""
    runs: dict = {pair: [] for pair in pairs}
    lengths = {pair: run_steps(profile, *pair, precision, steps, seconds) for pair in pairs}
    for index in range(repeats):
        for pair in pairs:
            runs[pair].append(measure(*pair, precision, lengths[pair], timeout))
            if progress is not None:
                progress()
        if after_round is not None:
            after_round(index, index == repeats - 1)
    if record is not None:
        record.update(runs)
    priced = after(profile) if after is not None else profile
    return [judge(priced, *pair, precision, runs[pair]) for pair in pairs]


class Recalibrations:
    """Calibrations taken among a validate's runs, and the profile they price the runs with: the average of
    the profiles of the window the runs were taken in (``simpar/calibrate/average.py``): a shared machine's
    state moves by tens of percent within an hour. ``every_round``: after
    each round of runs (every case once), so the profiles sample the same stretch of time as the runs;
    otherwise once, after the last round. The profile from before counts with ``before_in_window`` (taken
    right before the runs, ``BEFORE_WINDOW_S``), not otherwise: by default it is the machine's cached
    calibration, possibly hours old, and of another window. Each is saved to ``save_as(index)`` (index: the round it followed). Each calibrates the world sizes
    ``worlds`` that the runs use (all the profile's if None), and a profile from before that lacks one of them
    is left out of the price."""

    def __init__(self, profile, profile_path: str, precision: str, save_as, every_round: bool = False,
                 progress=None, worlds=None, before_in_window: bool = True):
        self.profile_path, self.precision, self.save_as = profile_path, precision, save_as
        self.every_round, self.progress, self.before_in_window = every_round, progress, before_in_window
        calibrated = sorted(int(w) for w in profile.ring)
        runs = tuple(sorted({w for w in worlds or () if w >= 2}))  # (one rank calibrates nothing side by side)
        self.worlds = runs or tuple(calibrated)
        # a profile from before that lacks a world size the runs use would price its cases with another's figures
        # (and the average keeps the sizes every profile has): it is left out, as a profile of another window is
        self.before_covers = set(self.worlds) <= set(calibrated)
        self.taken: list[tuple[object, str]] = []  # (profile, where it was saved)

    def after_round(self, index: int, last: bool) -> None:
        if not (self.every_round or last):
            return
        from simpar.calibrate import calibrate

        later = calibrate(self.precision, self.worlds, progress=self.progress)
        path = self.save_as(index)
        later.save(path)
        self.taken.append((later, path))

    def counts_before(self) -> bool:
        """Whether the profile from before prices the runs: it is of their window and has every world size they
        use, or nothing else was taken."""
        return (self.before_in_window and self.before_covers) or not self.taken

    def _window(self, profile) -> list[tuple[object, str]]:
        return ([(profile, self.profile_path)] if self.counts_before() else []) + self.taken

    def sources(self, profile) -> list[str]:
        """Where the profiles the runs are priced with come from (``priced``)."""
        return [path for _, path in self._window(profile)]

    def profiles(self, profile) -> list:
        """The profiles of the runs' window that ``priced`` averages, each as calibrated."""
        return [p for p, _ in self._window(profile)]

    def priced(self, profile):
        """The average of the profiles of the runs' window: the calibrations taken among them, and
        ``profile`` if it was taken right before them (``profile`` itself if no calibration was taken)."""
        from simpar.calibrate.average import average_profiles

        window = self._window(profile)
        if len(window) == 1:
            return window[0][0]
        return average_profiles([p for p, _ in window], [path for _, path in window], common=True)


def save_runs(path: str, runs: dict, profiles: list) -> None:
    """The real runs of a validate (``run_cases``' ``record``) with the profiles that priced them, as JSON:
    ``reprice`` prices the same runs again with another profile (an ablation of a term, a new model)."""
    import json
    from dataclasses import asdict

    with open(path, "w") as handle:
        json.dump({"model": MODEL, "profiles": [asdict(p) for p in profiles],
                   "cases": [{"strategy": s, "gpus": g, "runs": [_lean(r) for r in case]}
                             for (s, g), case in runs.items()]}, handle)


def _lean(run: dict) -> dict:
    """A real run without its timelines, which no price is judged against."""
    return {k: v for k, v in run.items() if k != "op_timeline"}


def load_runs(path: str) -> dict:
    import json

    with open(path) as handle:
        return json.load(handle)


def reprice(saved: dict, profile, precision: str = "fp32") -> list[dict]:
    """The saved runs (``save_runs``) judged again, each case priced with ``profile``."""
    return [judge(profile, c["strategy"], c["gpus"], precision, c["runs"]) for c in saved["cases"]]


def resolutions(cases: list[dict], profiles: list, precision: str) -> dict[int, dict]:
    """World size -> what its cases' own noise lets a validate judge (``simpar/referee.py``): the runs' spread,
    and with two profiles or more (the calibrations of the runs' window) the spread of their prices."""
    from simpar.referee import resolution

    out = {}
    for world in sorted({c["gpus"] for c in cases}):
        mine = [c for c in cases if c["gpus"] == world]
        prices = [[price(p, c["strategy"], world, precision) for p in profiles] for c in mine] \
            if len(profiles) > 1 else None
        found = resolution([c["real_runs_s"] for c in mine], prices)
        if found:
            out[world] = found
    return out


def price(profile, strategy: str, gpus: int, precision: str) -> float:
    """A case's step time as ``profile`` prices it (seconds)."""
    return simulate(case_scenario(strategy, gpus, precision), topology=profile.topology(gpus, precision),
                    serial=True).step_time_s


def summary(cases: list[dict]) -> dict:
    errors = [abs(c["error"]) for c in cases]
    out = {"cases": len(cases), "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
           "median_spread": statistics.median(c.get("spread", 0.0) for c in cases),
           "bytes_exact": all(c["bytes_exact"] for c in cases), "memory_exact": all(c["memory_exact"] for c in cases)}
    return out


def write_report(path: Path, profile_path: str, cases: list[dict], result: dict, after: str = "",
                 before_too: bool = True) -> list[Path]:
    """The markdown report at ``path``, the CSV and the plot beside it; returns the files written."""
    csv_path, plot_path = path.with_suffix(".csv"), path.with_suffix(".png")
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["strategy", "gpus", "sim_step_s", "real_step_s", "error", "spread", "steps",
                                         "bytes_exact", "memory_exact"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(cases)
    _plot(plot_path, cases)
    lines = [f"# simpar validate: {MODEL}, {len(cases)} cases", "",
             f"Hardware profile: `{profile_path}` (micro-benchmarks only; no case below was used to fit it)"
             + ((f", averaged with the calibrations taken among the runs (`{after}`, `--calibrate-after`)"
                 if before_too else f"; the cases priced with the calibrations taken among the runs alone, "
                                    f"averaged (`{after}`, `--calibrate-after`): the profile, older than the runs' "
                                    f"window or without every world size they use, only sized the runs")
                 if after else "") + ".",
             "",
             f"median |error| {100 * result['median_abs_error']:.1f} %, max |error| "
             f"{100 * result['max_abs_error']:.1f} %, bytes exact: {result['bytes_exact']}, "
             f"model-state memory exact: {result['memory_exact']}; median run-to-run spread of the measured "
             f"step time {100 * result['median_spread']:.1f} % (runs per case: {len(cases[0]['real_runs_s'])})", ""]
    if result.get("resolution"):
        from simpar.referee import describe, describe_whole

        lines += ["What this window's own noise lets it judge (simpar/referee.py):", ""]
        lines += [f"- {describe(int(world), r)}" for world, r in result["resolution"].items()]
        lines += [f"- {describe_whole(result['resolution_whole'])}"] if result.get("resolution_whole") else []
        lines += [""]
    lines += ["| strategy | ranks | simulated | measured | error | spread | steps a run | bytes exact | memory exact |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: |"]
    for c in cases:
        lines.append(f"| {c['strategy']} | {c['gpus']} | {1e3 * c['sim_step_s']:.1f} ms | "
                     f"{1e3 * c['real_step_s']:.1f} ms | {100 * c['error']:+.1f} % | {100 * c['spread']:.0f} % | "
                     f"{c.get('steps') or ''} | "
                     f"{'yes' if c['bytes_exact'] else 'NO'} | {'yes' if c['memory_exact'] else 'NO'} |")
    lines += _op_class_table(cases)
    lines += ["", f"![simulated against measured step time]({plot_path.name})", ""]
    path.write_text("\n".join(lines))
    return [path, csv_path, plot_path]


def _op_class_table(cases: list[dict]) -> list[str]:
    """Markdown: where each case's step went, priced / measured per op class (``judge``'s ``op_time_s``), so
    a miss can be traced to its ops; none for cases without it."""
    cases = [c for c in cases if c.get("op_time_s")]
    if not cases:
        return []
    kinds = [k for k in OP_CLASSES if any(any(c["op_time_s"].get(k, (0.0, 0.0))) for c in cases)]
    lines = ["", "Time per op class, priced / measured (ms per rank and step, the median run; ops run one at a time; "
             "the executor's work between ops is priced in its computes, measured outside every op):",
             "", "| strategy | ranks | " + " | ".join(kinds) + " |", "| --- | ---: |" + " ---: |" * len(kinds)]
    for c in cases:
        cells = [f"{1e3 * c['op_time_s'][k][0]:.2f} / {1e3 * c['op_time_s'][k][1]:.2f}" for k in kinds]
        lines.append(f"| {c['strategy']} | {c['gpus']} | " + " | ".join(cells) + " |")
    return lines


def _plot(path: Path, cases: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for strategy in dict.fromkeys(c["strategy"] for c in cases):
        mine = [c for c in cases if c["strategy"] == strategy]
        ax.scatter([1e3 * c["real_step_s"] for c in mine], [1e3 * c["sim_step_s"] for c in mine], label=strategy)
    times = [1e3 * t for c in cases for t in (c["real_step_s"], c["sim_step_s"])]
    low, top = 0.8 * min(times), 1.25 * max(times)
    ax.plot([low, top], [low, top], color="grey", linewidth=1)
    ax.fill_between([low, top], [0.95 * low, 0.95 * top], [1.05 * low, 1.05 * top], color="grey", alpha=0.2,
                    label="±5 %")
    ax.set_xscale("log")  # step times span three orders of magnitude across strategies and ranks
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("simulated step time (ms)")
    ax.set_title("simpar validate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
