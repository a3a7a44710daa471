"""``simpar calibrate``: measure this machine with micro-benchmarks and fit a hardware profile.

One rank alone: the units' compute (embedding, layer, head of several models and micro-batches) timed by the
executor's own step, in passes spread over the calibration, as the machine's speed drifts; the optimizer step
and copies. Then k = 2, 4, 8... ranks at once: the executor's ring back to back, its collectives and pipeline
messages in the step's pattern (a unit's compute, then one or several calls), and calls after computes from a
tensor-parallel piece to a whole step. Nothing runs a strategy: ``simpar validate`` judges the profile on
strategies the fit never saw. Profiles are cached per machine, torch version and precision (``default_path``),
so ``simpar run --compare-real`` picks them up; ``quick`` takes the few minutes down to under half a minute.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from simpar.calibrate.bench import PATTERN_OPS, SHORT_LOOPS, host_worker, pattern_worker, phase_cost, phase_worker, \
    ring_worker
from simpar.calibrate.compute_bench import compute_worker
from simpar.calibrate.fits import (SERIES, fit_collective_costs, fit_compute, fit_handling, fit_line, ring_price,
                                   ring_steps, series_wake, step_bytes)
from simpar.calibrate.lag import later_steps, wake_curve
from simpar.calibrate.pipeline_bench import late_recv_cost, late_worker, relay_worker
from simpar.calibrate.profile import PER_WORLD, PHASE_SIZE, SHORT_SIZE, HardwareProfile
from simpar.real.cpu_profile import machine_id
from simpar.real import awake
from simpar.real.launch import launch

# tiny-deep's layer is tiny's with 8 heads of 8 instead of 4 of 16: the same FLOPs, twice the attention
# scores, which the CPU attention kernel pays for; small's longer units pin the FLOP rate
MODELS, QUICK_MODELS = ["tiny", "small", "tiny-deep"], ["tiny", "tiny-deep"]
BATCHES, QUICK_BATCHES = [1, 2, 4], [1, 2]
RING_SIZES = [2**k for k in range(12, 22)]  # 4 KiB to 2 MiB
PATTERN_SIZES = [2**12, 2**18, 2**21]  # 4 KiB to 2 MiB: a TP activation to a DDP bucket
PHASE_SECONDS = 12.0  # phase_worker's loops at the default 10 repeats: seconds average the cores' states
OPTIMIZER_PARAMS = [2**14, 2**18, 2**20]
MIN_PASSES, QUICK_PASSES = 3, 2  # one-rank compute passes: before, between and after the worlds (a drifting machine)
QUICK_REPEATS, QUICK_ROUNDS = 2, 2
QUICK_RANKS_PER_CORE = 8  # a quick calibration measures a run's own world up to this many ranks a core
LIGHT_UNITS = (1, 8, 32)  # the computes before a call a light measurement times (of phase_worker's PHASE_UNITS)


def default_path(precision: str) -> Path:
    """Where this machine's profile is cached: per host and torch version (either changes what a step costs)."""
    root = Path(os.environ.get("SIMPAR_CACHE", Path.home() / ".cache" / "simpar"))
    machine = machine_id()
    return root / f"hardware-{machine['host']}-torch{machine['torch']}-{precision}.json"


def gpu_default_path(preset: str) -> Path:
    """Where this machine's GPU profile is cached."""
    return default_path("gpu").with_name(f"gpu-{machine_id()['host']}-{preset}.json")


def quick_worlds(world: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(worlds measured in full, worlds measured light) by a quick calibration for a run of ``world`` ranks: 2
    ranks in full (every term), and the run's own world: in full where its ranks fit twice the cores, else light
    (the step's collectives alone: where ranks outnumber the cores a call's cost grows with them in a way no
    smaller world predicts) up to ``QUICK_RANKS_PER_CORE`` ranks a core, beyond which profile.py reads larger
    worlds from the largest measured."""
    cores = os.cpu_count() or 1
    if world <= 2 * cores:
        return tuple(sorted({2, max(2, world)})), ()
    return (2,), (min(world, QUICK_RANKS_PER_CORE * cores),)


def _one_rank_worker(ctx, models: list[str], batches: list[int], precision: str, repeats: int, host: bool) -> dict:
    """A pass of the units' compute, and with ``host`` the optimizer and copies (one launch: each costs seconds)."""
    return {"compute": compute_worker(ctx, models, batches, precision, repeats),
            "host": host_worker(ctx, OPTIMIZER_PARAMS, repeats) if host else None}


def _ranks_worker(ctx, precision: str, repeats: int, rounds: int) -> dict:
    return {"ring": ring_worker(ctx, RING_SIZES if rounds > QUICK_ROUNDS else RING_SIZES[::3], repeats),
            "pattern": pattern_worker(ctx, PATTERN_SIZES, repeats, rounds),
            "relay": relay_worker(ctx, 3 * repeats),
            "late": late_worker(ctx, 10 * repeats),
            "phases": phase_worker(ctx, PHASE_SIZE, PHASE_SECONDS * repeats / 10, short_size=SHORT_SIZE)}


def _light_worker(ctx, precision: str, repeats: int, rounds: int) -> dict:
    """The step's pattern at the smallest and largest size in series, and calls after ``LIGHT_UNITS`` units."""
    return {"pattern": pattern_worker(ctx, PATTERN_SIZES[::2], repeats, rounds=1, counts=(SERIES,), least=2),
            "phases": phase_worker(ctx, PHASE_SIZE, PHASE_SECONDS * repeats / 10, repeats, units=LIGHT_UNITS,
                                   short_loops=False)}


def pattern_rows(ranks: list[dict], world: int, resume: float = 0.0) -> list[dict]:
    """Per op, size and number of calls in a row: ring steps, bytes per step, and seconds the calls cost (the
    median round of rank 0: the barriers make every rank's loop equally long), less ``resume``: each
    repetition's compute after the calls pays that, and the simulator charges it to the compute."""
    timings = ranks[0]["pattern"]
    return [{"op": op, "bytes": size, "calls": calls, "steps": ring_steps(op, world),
             "step_bytes": step_bytes(op, size, world),
             "seconds": max(statistics.median(timings[f"{op}{size}x{calls}"]) - resume, 0.0)}
            for op in PATTERN_OPS for size in PATTERN_SIZES for calls in (1, SERIES)
            if f"{op}{size}x{calls}" in timings]  # a light measurement times some of them


def average_passes(passes: list[list[dict]]) -> list[dict]:
    """The rows of several ``compute_worker`` passes (the same units, in the same order), each timing the median
    of the passes: a pass drawn in one of the machine's slow states reads every row slow at once."""
    rows = []
    for same in zip(*passes):
        row = dict(same[0])
        for key in [k for k in row if k.endswith("_s")]:
            row[key] = statistics.median(r[key] for r in same)
        rows.append(row)
    return rows


def _pattern_terms(ranks: list[dict], world: int) -> dict:
    """The terms the step's pattern measures (``pattern_worker``): the ring step, the wakes, the resume, the
    handoff and the Worker-Server all-reduce."""
    inside = statistics.fmean(t for r in ranks for t in r["pattern"]["compute"])
    without = statistics.fmean(t for r in ranks for t in r["pattern"]["compute_base"])
    resume = max(inside - without, 0.0)  # the unit right after a call against it in a loop without calls
    rows = pattern_rows(ranks, world, resume)
    ring_rows = [row for row in rows if row["op"] != "psreduce"]
    # the first call's extra, timed inside each repetition of a series, against the calls after it
    wake = series_wake([r["pattern"]["series"] for r in ranks])
    wake, handoff, alpha, bandwidth, _ = fit_collective_costs(ring_rows, wake)
    ps_wake = series_wake([r["pattern"]["series_ps"] for r in ranks])
    _, _, leg, leg_rate, _ = fit_collective_costs([row for row in rows if row["op"] == "psreduce"], ps_wake)
    return {"ring": [alpha, bandwidth], "wake": wake, "resume": resume, "handoff": handoff,
            "worker_server": [ps_wake, leg, leg_rate], "shared": {"pattern": rows}}


def measure_world(world: int, precision: str, repeats: int, timeout: float, rounds: int = 5,
                  light: bool = False) -> dict:
    """Every term measured with ``world`` ranks at once (see the profile's fields); ``rounds`` of the step's
    pattern. ``light`` (a world of many ranks a core): the collectives' terms alone (``_light_worker``)."""
    ranks = launch(_light_worker if light else _ranks_worker, world, (precision, repeats, rounds), timeout=timeout)
    terms = _pattern_terms(ranks, world)
    alpha, bandwidth = terms["ring"]
    phases, extras, record = wake_curve(ranks)
    loop_price = ring_price("allreduce", PHASE_SIZE, world, alpha, bandwidth)
    terms["shared"]["phases"] = record
    terms.update(wake_phase=phases[0], wake_curve=[phases, extras],
                 later_steps=later_steps(record["call_s"], extras, loop_price, terms["wake"]))
    if light:
        return terms
    # a pipeline's stages take turns: the same unit right after a receive, against it once more
    after_recv = max(statistics.fmean(a - b for r in ranks for a, b in zip(r["relay"]["after"], r["relay"]["again"])),
                     0.0)
    short = [phase_cost([r["phases"][key] for r in ranks]) for key in SHORT_LOOPS]
    gathers = [statistics.median(r["ring"][i]["seconds"] for r in ranks) for i in range(len(ranks[0]["ring"]))]
    back_alpha, per_byte = fit_line([row["bytes"] / world for row in ranks[0]["ring"]],
                                    [t / (world - 1) for t in gathers])
    terms["shared"].update({"back_to_back": [back_alpha, 1.0 / per_byte if per_byte else 1e12],
                            "short_calls": [list(c) for c in short]})
    return {**terms, "wake_short": [[c, call - ring_price("allreduce", SHORT_SIZE, world, alpha, bandwidth)]
                                    for c, call in short],
            "resume_after_recv": after_recv, "late_recv": late_recv_cost([r["late"] for r in ranks], bandwidth)}


def add_worlds(profile: HardwareProfile, precision: str, worlds: tuple[int, ...], light: tuple[int, ...] = (),
               repeats: int = QUICK_REPEATS, timeout: float = 600.0, progress=None) -> HardwareProfile:
    """``profile`` with ``worlds`` measured in full and ``light`` ones light, as a quick calibration does."""
    say = progress or (lambda message: None)
    for world in sorted(set(worlds) | set(light)):
        say(f"{world} ranks at once" + (", light" if world in light else ""))
        _put(profile, world, measure_world(world, precision, repeats, timeout, QUICK_ROUNDS, light=world in light))
    return profile


def _put(profile: HardwareProfile, world: int, terms: dict) -> None:
    """A world's terms into ``profile`` in place of all it had: what a light one did not measure is read from the
    nearest world that did, not left over."""
    key = str(world)
    for table in PER_WORLD:
        getattr(profile, table).pop(key, None)
    profile.samples.setdefault("shared", {})[key] = terms["shared"]
    for table, value in terms.items():
        if table != "shared":
            getattr(profile, table)[key] = value


def calibrate(precision: str = "fp32", worlds: tuple[int, ...] = (2, 4, 8), repeats: int = 10,
              timeout: float = 600.0, progress=None, quick: bool = False,
              light: tuple[int, ...] = ()) -> HardwareProfile:
    """Run the micro-benchmarks and fit; ``progress(message)`` is told each stage. ``quick``: fewer models,
    batches and repeats (about 20 s at 2 and 4 ranks); ``light``: worlds measured light after the others."""
    say = progress or (lambda message: None)
    repeats = QUICK_REPEATS if quick else repeats
    models, batches = (QUICK_MODELS, QUICK_BATCHES) if quick else (MODELS, BATCHES)

    passes: list[list[dict]] = []

    def compute_pass(host: bool = False) -> dict:
        say(f"compute, one rank (pass {len(passes) + 1})" + (", optimizer and copies" if host else ""))
        return launch(_one_rank_worker, 1, (models, batches, precision, repeats, host), timeout=timeout)[0]

    first = compute_pass(host=True)
    passes.append(first["compute"])
    host = first["host"]
    measured = {}
    for index, world in enumerate(worlds):
        say(f"{world} ranks at once")
        measured[world] = measure_world(world, precision, repeats, timeout, QUICK_ROUNDS if quick else 5)
        if not quick and index < len(worlds) - 1:  # compute passes spread between the worlds' measurements
            passes.append(compute_pass()["compute"])
    while len(passes) < (QUICK_PASSES if quick else MIN_PASSES):
        passes.append(compute_pass()["compute"])
    alone = average_passes(passes)
    compute, scores, step = fit_compute(alone)
    rates = {}
    for name in ("adam", "sgd"):
        rows = [s for s in host["steps"] if s["optimizer"] == name]
        _, seconds_per_param = fit_line([s["params"] for s in rows], [s["seconds"] for s in rows])
        rates[name] = 1.0 / seconds_per_param if seconds_per_param else 1e10
    _, seconds_per_byte = fit_line([c["bytes"] for c in host["copies"]], [c["seconds"] for c in host["copies"]])
    profile = HardwareProfile(
        machine={**machine_id(), "kept_awake": awake.enabled(), "quick": quick}, compute={precision: compute},
        optimizer_params_per_s=rates, copy_bytes_per_s=1.0 / seconds_per_byte if seconds_per_byte else 1e11,
        ring={}, attention_scores={precision: scores}, optimizer_step={precision: step} if step else {},
        handling={precision: fit_handling(alone)}, samples={"compute": alone, "host": host, "shared": {}})
    for world, terms in measured.items():
        _put(profile, world, terms)
    return add_worlds(profile, precision, (), light, repeats, timeout, progress=progress)
