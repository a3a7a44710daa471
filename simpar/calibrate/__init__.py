"""``simpar calibrate``: measure this machine with micro-benchmarks and fit a hardware profile.

One rank alone (compute of every unit kind at several sizes, timed again after each world size and
averaged, as the machine's speed drifts; optimizer steps and copies), then
k = 2, 4, 8... ranks at once: the executor's ring all-gather back to back by message size (for the
record), and its all-gather and all-reduce in the step's pattern (a unit's compute, then one or
several calls in a row), which the collective costs and the compute slowdown inside a step are
fitted to. Profiles are cached per machine and precision (``default_path``) so ``simpar run
--compare-real`` picks them up.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from simpar.calibrate.bench import (PATTERN_OPS, PHASE_UNITS, SHORT_LOOPS, burst_worker, host_worker,
                                   pattern_worker, phase_cost, phase_worker, ring_worker)
from simpar.calibrate.compute_bench import compute_worker
from simpar.calibrate.lag import later_steps, wake_curve
from simpar.calibrate.pipeline_bench import busy_late_worker, late_recv_cost, late_worker, relay_worker
from simpar.calibrate.fits import (adam_per_tensor, fit_collective_costs, fit_compute, fit_line, fit_optimizer_step,
                                  fit_sharded_work, fit_tensor_work, ring_price, ring_steps, step_bytes)
from simpar.calibrate.profile import PHASE_SIZE, SHORT_SIZE, HardwareProfile, machine_id
from simpar.calibrate.series import (SERIES, SERIES_SECONDS, scatter_level, series_first, series_last, series_late,
                                    series_level, series_positions, series_wake, series_worker)
from simpar.calibrate.tail import fit_tail, position_means, tail_worker
from simpar.calibrate.tp_bench import fit_tp_pieces, tp_piece_worker
from simpar.real import awake, gloo_threads, host_speed
from simpar.real.launch import launch
from simpar.spread import spread_of

# tiny-deep's layer is tiny's with 8 heads of 8 instead of 4 of 16: the same FLOPs, twice the attention
# scores, which the CPU attention kernel pays for (``fit_unit_costs``); two shapes of 4 heads cannot tell them
MODELS = ["tiny", "small", "tiny-deep"]
BATCHES = [1, 2, 4]
RING_SIZES = [2**k for k in range(12, 22)]  # 4 KiB to 2 MiB
PATTERN_SIZES = [2**12, 2**18, 2**21]  # 4 KiB to 2 MiB: a TP activation to a DDP bucket
# how long phase_worker's loops run at the default 10 repeats (fewer repeats: shorter): long enough to
# average the states of this VM's cores, which flip between fast and slow for seconds at a time
PHASE_SECONDS = 12.0
BURST_SECONDS = 6.0  # the same for burst_worker's rounds (the compute slowdown of ranks computing at once)
OPTIMIZER_PARAMS = [2**14, 2**18, 2**20]
MIN_PASSES = 3  # one-rank compute passes a calibration takes at least (one per world size and one before)


def default_path(precision: str) -> Path:
    """Where this machine's profile is cached."""
    root = Path(os.environ.get("SIMPAR_CACHE", Path.home() / ".cache" / "simpar"))
    return root / f"hardware-{machine_id()['host']}-{precision}.json"


def gpu_default_path(preset: str) -> Path:
    """Where this machine's GPU profile is cached."""
    return default_path("gpu").with_name(f"gpu-{machine_id()['host']}-{preset}.json")


def _both(ctx, precision: str, repeats: int) -> dict:
    return {"ring": ring_worker(ctx, RING_SIZES, repeats),
            "pattern": pattern_worker(ctx, PATTERN_SIZES, repeats),
            "relay": relay_worker(ctx, 3 * repeats),
            "late": late_worker(ctx, 10 * repeats),
            # (at 2 ranks its one pair is late_worker's: nothing more to time)
            "busy_late": busy_late_worker(ctx, 10 * repeats) if ctx.world > 2 else {},
            "phases": phase_worker(ctx, PHASE_SIZE, PHASE_SECONDS * repeats / 10, ps_size=PATTERN_SIZES[-1],
                                   short_size=SHORT_SIZE)}


def resume_point(after: float, base: float, slowdown: float) -> list[float]:
    """[seconds alone of phase_worker's short forward, what it pays more right after a call], from its mean
    time right after a call and in the loop without calls (every rank at once): the latter over ``slowdown``,
    and their difference, at least 0."""
    return [base / slowdown, max(after - base, 0.0)]


def pattern_rows(ranks: list[dict], world: int, resume: float = 0.0) -> list[dict]:
    """Per op, size and number of calls in a row: ring steps, bytes per step, and seconds the calls
    cost (the median round of rank 0: the barriers make every rank's loop equally long), which is
    what the loop took beyond the compute less ``resume``: each repetition's compute after the calls
    pays that more, and the simulator charges it to the compute, not to the calls."""
    timings = ranks[0]["pattern"]
    return [{"op": op, "bytes": size, "calls": calls, "steps": ring_steps(op, world),
             "step_bytes": step_bytes(op, size, world),
             "seconds": max(statistics.median(timings[f"{op}{size}x{calls}"]) - resume, 0.0)}
            for op in PATTERN_OPS for size in PATTERN_SIZES for calls in (1, SERIES)]


def average_passes(passes: list[list[dict]]) -> list[dict]:
    """The rows of several ``compute_worker`` passes (the same units, in the same order) with each
    unit's forward, backward and optimizer step seconds the median of the passes (two: their mean);
    ``passes_<key>`` keeps each pass's, for the record. The median, as a pass drawn in one of this VM's slow
    states reads every row slow at once (2026-11-26: one pass of three calibrations read the layer's forward
    593 us where the other five read 391-414), and the mean of a calibration's two passes took half of it."""
    rows = []
    for same in zip(*passes):
        row = dict(same[0])
        timed = ("fwd_s", "bwd_s", "between_ops_s", "step_s", "reduce_s", "gather_s", "scatter_s", "concat_s",
                 "cold_concat_s")
        for phase in [p for p in timed if p in row]:
            row[f"passes_{phase}"] = [r[phase] for r in same]
            row[phase] = statistics.median(row[f"passes_{phase}"])
        for gaps in [g for g in ("fwd_gaps", "bwd_gaps") if all(g in r for r in same)]:  # position by position
            row[gaps] = [statistics.fmean(values) for values in zip(*(r[gaps] for r in same))]
        rows.append(row)
    return rows


def ranks_slowdown(burst: dict, world: int, cores: int) -> float:
    """How much slower each of ``world`` ranks computes with all of them computing at once (``burst_worker``'s
    rounds): where they fit the ``cores``, a rank's own pace beside the others over its pace alone
    ("own_ratio"), not the slowest rank's, whose lead the calls after a compute pay (``wake_curve``; counted
    in the compute too it was paid twice, and 2-rank windows priced the data-parallel family's compute
    17-35 % over their runs, 2026-11-27). Where they outnumber the cores, the same for the same reason, the
    ranks' own paces averaged ("ranks_own_ratio", at least 1: below, noise): the rounds' pace ("ratio", the
    slowest rank's, time slices handed out unevenly) paid that lead twice too. Three 21-case windows priced
    every data-parallel strategy's compute at 4 ranks 14-46 % over its measured per-op times (forty-eighth
    stop, docs/calibration.md), the Worker-Server's, whose calls were priced right, most of all; the rounds
    read 2.35 / 2.65x at 4 ranks where rank 0's own pace read 2.07 / 2.19x, and the ranks' averaged 2.08-2.43x in
    the six calibrations after (2026-12-01)."""
    if world <= cores:
        return burst["own_ratio"]
    return max(burst.get("ranks_own_ratio", burst["ratio"]), 1.0)


def calibrate(precision: str = "fp32", worlds: tuple[int, ...] = (2, 4, 8), repeats: int = 10,
              timeout: float = 600.0, progress=None) -> HardwareProfile:
    """Run the micro-benchmarks and fit; ``progress(message)`` is told each stage."""
    say = progress or (lambda message: None)
    started = time.time()
    say("compute and optimizer, one rank")
    # compute is timed again after each world size below and the times averaged: this machine's speed
    # drifts by tens of percent over minutes (a snapshot once at the start came out 2x fast in one
    # calibration and priced every strategy 30-50 % short)
    passes = [compute_pass(precision, repeats, timeout)]
    host = launch(host_worker, 1, (OPTIMIZER_PARAMS, repeats), timeout=timeout)[0]
    slowdown, ring, wake, handoff, resume, resume_after_recv, shared = {"1": 1.0}, {}, {}, {}, {}, {}, {}
    handoff_step: dict[str, float] = {}
    curve, ps_curve, phase, unit_alone, issue, worker_server, short_wake, late = {}, {}, {}, {}, {}, {}, {}, {}
    late_busy = {}
    later_calls, last_calls, series_calls, resume_short, resume_tail, later = {}, {}, {}, {}, {}, {}
    issue_spread = {}
    for world in worlds:
        say(f"{world} ranks at once: compute and ring steps")
        ranks = launch(_both, world, (precision, repeats), timeout=timeout)
        fit_cores = world <= (os.cpu_count() or 1)  # some terms are measured only where the ranks fit the cores
        # k ranks computing at once, as a data-parallel step's all do, slow each other (the cores, memory
        # bandwidth and caches are shared); a unit computed right after a call takes longer still (resume:
        # against the same unit in the neighbouring loop without calls, every rank computing in both)
        burst = launch(burst_worker, world, (repeats, 5, BURST_SECONDS * repeats / 10), timeout=timeout)[0]
        slowdown[str(world)] = ranks_slowdown(burst, world, os.cpu_count() or 1)
        inside = statistics.fmean(t for r in ranks for t in r["pattern"]["compute"])
        without = statistics.fmean(t for r in ranks for t in r["pattern"]["compute_base"])
        resume[str(world)] = max(inside - without, 0.0)
        # a pipeline's stages take turns: the same unit right after a receive, against it once more
        resume_after_recv[str(world)] = max(statistics.fmean(
            a - b for r in ranks for a, b in zip(r["relay"]["after"], r["relay"]["again"])), 0.0)
        # resume was measured on pattern_worker's unit: its time alone (the relay's second compute: one rank at
        # a time, nothing before it) is what a shorter compute pays its share of (tp's half-layer pieces after
        # an all-reduce paid ~0.1 ms where this unit paid 0.61 ms, on 2 ranks; docs/calibration.md)
        unit_alone[str(world)] = statistics.fmean(t for r in ranks for t in r["relay"]["again"])
        # ... and a short compute of the executor's kind pays nearly as much: a point on the way (phase_worker)
        forwards = {key: statistics.fmean(t for r in ranks for t in r["phases"][key])
                    for key in ("resume_forward", "resume_forward_base") if key in ranks[0]["phases"]}
        if forwards:
            resume_short[str(world)] = resume_point(*forwards.values(), slowdown[str(world)])
        # every compute after a call's first runs a fraction longer (calibrate/tail.py), measured where the ranks
        # fit the cores
        tail = {}
        if fit_cores:
            tails = launch(tail_worker, world, (2 * repeats + 4,), timeout=timeout)
            after, without = position_means(tails, "call"), position_means(tails, "none")
            resume_tail[str(world)] = fit_tail(after, without)
            tail = {"tail": {"call": after, "none": without}}
        gathers = [statistics.median(r["ring"][i]["seconds"] for r in ranks) for i in range(len(RING_SIZES))]
        # back to back, an all-gather of S bytes is k - 1 ring steps of S / k bytes: one step's latency and
        # bandwidth with nothing before it, kept to show what the step's pattern adds (README, calibration)
        steps = [t / (world - 1) for t in gathers]
        alpha, seconds_per_byte = fit_line([row["bytes"] / world for row in ranks[0]["ring"]], steps)
        rows = pattern_rows(ranks, world, resume[str(world)])
        # the first call's extra, timed inside each repetition (a fit of 1 call against 4 in a row split it
        # from the step latency anywhere between 0 and 1.9 ms at 2 ranks as the machine drifted)
        measured_wake = series_wake([r["pattern"]["series"] for r in ranks])
        # what a pipeline send's isend holds its sender, right after computing: the mean, stalls included, and the
        # spread (mostly a fraction of a millisecond, now and then a scheduler slice), which the simulator draws from
        issued = [t for r in ranks for t in r["pattern"]["issued"]]
        issue[str(world)], issue_spread[str(world)] = statistics.fmean(issued), spread_of(issued)
        ring_rows = [row for row in rows if row["op"] != "psreduce"]
        # (a handoff's step its own where collectives run with gloo's thread at SCHED_BATCH and sends do not)
        wake[str(world)], handoff[str(world)], step_alpha, bandwidth, handoff_step[str(world)] = \
            fit_collective_costs(ring_rows, measured_wake, own_handoff_step=gloo_threads.enabled())
        # the Worker-Server all-reduce on its own: its first call's wake, and each one-way leg as the server
        # takes them in turn (at 4 ranks on 2 cores 2.5 ms a call at 4 KiB, where legs priced as half a ring
        # step, 1.8 ms each, came to 7.2 ms: a leg wakes two ranks, a ring step waits for all four)
        ps_wake = series_wake([r["pattern"]["series_ps"] for r in ranks])
        _, _, leg, leg_rate, _ = fit_collective_costs([row for row in rows if row["op"] == "psreduce"], ps_wake)
        worker_server[str(world)] = [ps_wake, leg, leg_rate]
        ring[str(world)] = [step_alpha, bandwidth]
        # the fifth and later calls of a series after computing (the executor's own ZeRO-3 gathers), per ring
        # step of the all-gathers timed (world - 1 each). Where ranks outnumber the cores every call waits for
        # time slices instead (20-29 ms a call at 8 ranks on 2 cores, its position's effect lost in them)
        # two patterns in turn, after a forward and after a backward (its reduce-scatter, then gathers), pooled
        positions, positions_bwd = [], []
        if fit_cores:
            timed = launch(series_worker, world, (SERIES_SECONDS * repeats / 10, precision), timeout=timeout)
            series, series_bwd = [r["series"] for r in timed], [r["series_bwd"] for r in timed]
            positions, positions_bwd = series_positions(series), series_positions(series_bwd)
            later_calls[str(world)] = series_late(series, series_bwd) / (world - 1)
            last_calls[str(world)] = series_last(series, series_bwd) / (world - 1)  # ... its last, before a compute
            series_calls[str(world)] = {"calls": timed[0]["calls"], "calls_bwd": timed[0]["calls_bwd"],
                                        **{key: statistics.fmean(r[key] for r in timed)
                                           for key in ("compute", "compute_bwd")}}
        # a pipeline receive posted after its send: gloo's rendezvous makes it wait for the sender's thread
        late[str(world)] = late_recv_cost([r["late"] for r in ranks], bandwidth)
        # ... by the ranks computing while it waits, one pair's (a pipeline computes on one or two stages at a time)
        late_busy[str(world)] = {k: late_recv_cost([r["busy_late"][k] for r in ranks[:2]], bandwidth)
                                 for k in ranks[0]["busy_late"]} or {"1": late[str(world)]}
        # ... and how much more a call costs after a longer compute (the wait for the slowest rank grows)
        curve_phases, extras, phases = wake_curve(ranks)
        curve[str(world)], phase[str(world)] = [curve_phases, extras], curve_phases[0]
        # ... and how far its loops' calls sit above their price (later steps), at every world: where the ranks
        # outnumber the cores too the loops sat above it (4 ranks: 6 of 7 calibrations, +2.3 ms on average)
        loop_steps = ring_price("allreduce", PHASE_SIZE, world, step_alpha, bandwidth)
        later[str(world)] = later_steps(phases["call_s"], extras, loop_steps, wake[str(world)])
        # ... the Worker-Server all-reduce's own: its server takes the early workers' pushes while it waits
        ps_phases, ps_extras, phases["ps"] = wake_curve(ranks, "ps")
        ps_curve[str(world)] = [ps_phases, ps_extras]
        # ... and after short ones (tensor-parallel pieces): [[a compute, what the first call after it costs beyond
        # the ring's price of that call], ...], one per loop of ``SHORT_LOOPS``, as the cost rises steeply between a
        # short piece and a unit and levels after. Against the price, not against the calls after it in the short
        # loop: those go at about the back-to-back pace (2 ranks, 16 KiB: 0.63-0.99 ms an all-reduce, back to
        # back 0.67-0.93), not at the step latency in a step, which is fitted on the calls after a unit's compute
        # (2 steps: 1.16-1.8 ms), and the simulator prices every call from that latency (docs/calibration.md). At a
        # tensor-parallel activation's size (``SHORT_SIZE``): at 256 KiB the fitted bandwidth's price of the bytes,
        # subtracted here and not paid back by tp's 16 KiB calls, ran about 0.1 ms a call over their cost
        short_calls = [phase_cost([r["phases"][key] for r in ranks]) for key in SHORT_LOOPS]
        short_wake[str(world)] = [[compute, call - ring_price("allreduce", SHORT_SIZE, world, step_alpha, bandwidth)]
                                  for compute, call in short_calls]
        shared[str(world)] = {"ring_seconds": steps, "pattern": rows, "pattern_compute": inside, "series": positions,
                              "series_calls": series_calls[str(world)]["calls"] if positions else [],
                              "series_bwd": positions_bwd,
                              "series_calls_bwd": series_calls[str(world)]["calls_bwd"] if positions else [],
                              # the compute before each: after a forward, after a backward
                              "series_compute": ([series_calls[str(world)][key] for key in ("compute", "compute_bwd")]
                                                 if positions else []),
                              "wake_fitted_with_the_steps": fit_collective_costs(ring_rows)[0],
                              "pattern_compute_without_calls": without, "burst_together": burst["together"],
                              "burst_own": burst["own"], "burst_own_ratio": burst["own_ratio"],
                              "burst_ranks_own_ratio": burst["ranks_own_ratio"],
                              "burst_ratio": burst["ratio"], "resume_forward": list(forwards.values()),
                              "relay": ranks[0]["relay"], "phases": phases,
                              "short_calls": [list(c) for c in short_calls],
                              "late": {size: statistics.fmean(t for r in ranks for t in r["late"][size])
                                       for size in ranks[0]["late"]},
                              # every isend's hold (the spread is read from them) and late receive
                              "issued": issued,
                              "late_times": {size: [t for r in ranks for t in r["late"][size]]
                                             for size in ranks[0]["late"]},
                              "late_busy_times": {k: {size: [t for r in ranks[:2] for t in r["busy_late"][k][size]]
                                                      for size in ranks[0]["busy_late"][k]}
                                                  for k in ranks[0]["busy_late"]},
                              "back_to_back": [alpha, 1.0 / seconds_per_byte if seconds_per_byte else 1e12], **tail}
        say(f"compute, one rank (pass {len(passes) + 1})")
        passes.append(compute_pass(precision, repeats, timeout))
    while len(passes) < MIN_PASSES:  # a median that one pass of a slow state cannot move
        say(f"compute, one rank (pass {len(passes) + 1})")
        passes.append(compute_pass(precision, repeats, timeout))
    alone = average_passes(passes)
    compute, between, step, table, scores, cold = fit_compute(alone)
    handling, sharded, concat = fit_tensor_work(alone), fit_sharded_work(alone), fit_tensor_work(alone, "concat_s")
    cold_concat = fit_tensor_work(alone, "cold_concat_s")
    # what the executor's ZeRO-3 gathers pay from the second of a series on beyond the price of a bare call
    levels = {w: series_level([(shared[w]["series"], timed["calls"]), (shared[w]["series_bwd"], timed["calls_bwd"])],
                              int(w), *ring[w], handling)
              for w, timed in series_calls.items()}
    # ... and their first, after a layer-sized compute: a point of the wake's share for ZeRO-3's gathers
    firsts = {w: series_first(shared[w]["series"], timed["calls"], timed["compute"], int(w), *ring[w], handling)
              for w, timed in series_calls.items()}
    rates = {}
    for name in ("adam", "sgd"):
        rows = [s for s in host["steps"] if s["optimizer"] == name and "tensors" not in s]
        _, seconds_per_param = fit_line([s["params"] for s in rows], [s["seconds"] for s in rows])
        rates[name] = 1.0 / seconds_per_param if seconds_per_param else 1e10
    _, seconds_per_byte = fit_line([c["bytes"] for c in host["copies"]], [c["seconds"] for c in host["copies"]])
    # whether the ranks ran beside the spinners that keep the cores awake (real/awake.py), and with gloo's
    # transport threads at SCHED_BATCH (real/gloo_threads.py): the calls are priced as measured, so a run
    # taken the other way is priced with costs it did not have
    machine = {**machine_id(), "kept_awake": awake.enabled(), "gloo_batch": gloo_threads.enabled()}
    profile = HardwareProfile(machine=machine, compute={precision: compute}, slowdown=slowdown, ring=ring,
                              wake=wake, wake_curve=curve, wake_phase=phase, handoff=handoff, handoff_step=handoff_step,
                              send_issue=issue,
                              late_recv=late, late_recv_busy=late_busy, send_issue_spread=issue_spread,
                              worker_server=worker_server, worker_server_curve=ps_curve, wake_short=short_wake,
                              short_size=SHORT_SIZE,
                              resume=resume, series_late=later_calls, series_last=last_calls, series_level=levels,
                              series_first=firsts,
                              resume_after_recv=resume_after_recv, resume_unit=unit_alone, between_ops=between,
                              resume_short=resume_short, resume_tail=resume_tail, later_steps=later,
                              optimizer_params_per_s=rates, optimizer_step={precision: step} if step else {},
                              optimizer_tensor=adam_per_tensor(host["steps"]),
                              step_concat={precision: concat} if step and concat else {},
                              step_concat_cold={precision: cold_concat} if step and concat and cold_concat else {},
                              tensor_work={precision: handling} if handling else {},
                              sharded_work={precision: sharded} if sharded else {},
                              embedding_table={precision: table}, attention_scores={precision: scores},
                              unit_cold={precision: cold} if cold else {},
                              copy_bytes_per_s=1.0 / seconds_per_byte if seconds_per_byte else 1e11,
                              samples={"compute": alone, "host": host, "shared": shared,
                                       "ring_sizes": RING_SIZES})
    # the executor's reduce-scatter of a layer's gradients after its backward (ZeRO-3's), against what the
    # profile prices it at after that compute
    profile.scatter_level = {w: scatter_level(profile, int(w), precision, shared[w]["series_bwd"][0],
                                              timed["compute_bwd"])
                             for w, timed in series_calls.items() if shared[w]["series_bwd"]}
    if precision == "fp32":  # the executor's tensor-parallel pieces, set against what the fit above prices them
        say("tensor-parallel pieces, one rank")
        pieces = launch(tp_piece_worker, 1, (MODELS, BATCHES, repeats), timeout=timeout)[0]
        profile.tp_piece = {precision: fit_tp_pieces(pieces, profile, precision)}
        profile.samples["tp_pieces"] = pieces
    # how fast the cores ran while it was measured (the spinners' loop: host_speed.py), so a run read at
    # another speed can be set against it
    profile.machine["host_speed"] = host_speed.reading(started, time.time())
    return profile


def compute_pass(precision: str = "fp32", repeats: int = 10, timeout: float = 600.0) -> list[dict]:
    """One pass of the units' compute on one rank, as ``calibrate`` times it (``compute_worker``)."""
    return launch(compute_worker, 1, (MODELS, BATCHES, precision, repeats), timeout=timeout)[0]


def retimed(profile: HardwareProfile, passes: list[list[dict]], precision: str) -> HardwareProfile:
    """A copy of ``profile`` whose unit compute, work between ops and optimizer step are fitted to ``passes``
    (of ``compute_pass``) instead; everything else (the k-rank slowdown, collectives, wake, resume) as
    calibrated."""
    alone = average_passes(passes)
    fitted, between, step, table, scores, cold = fit_compute(alone)
    steps = {**profile.optimizer_step, precision: step} if step else profile.optimizer_step
    handling, concat = fit_tensor_work(alone), fit_tensor_work(alone, "concat_s")
    handled = {**profile.tensor_work, precision: handling} if handling else profile.tensor_work
    concats = {**profile.step_concat, precision: concat} if step and concat else profile.step_concat
    cold_concat = fit_tensor_work(alone, "cold_concat_s")
    colds = ({**profile.step_concat_cold, precision: cold_concat} if step and concat and cold_concat
             else profile.step_concat_cold)
    sharded = fit_sharded_work(alone)
    sharded = {**profile.sharded_work, precision: sharded} if sharded else profile.sharded_work
    return replace(profile, compute={**profile.compute, precision: fitted}, between_ops=between, optimizer_step=steps,
                   tensor_work=handled, sharded_work=sharded, step_concat=concats, step_concat_cold=colds,
                   embedding_table={**profile.embedding_table, precision: table},
                   attention_scores={**profile.attention_scores, precision: scores},
                   unit_cold={**profile.unit_cold, precision: cold} if cold else profile.unit_cold,
                   samples={**profile.samples, "compute_retimed": alone})


def calibrate_gpu(preset: str | None = None, timeout: float = 600.0, progress=None):
    """Measure this machine's CUDA GPU (and NCCL across its GPUs) and fit a GPUProfile."""
    import torch

    from simpar.calibrate import gpu_bench
    from simpar.calibrate.gpu_profile import fit_allreduce, fit_profile, preset_for
    from simpar.devices.presets import GPUS
    from simpar.errors import SimparError

    say = progress or (lambda message: None)
    if not torch.cuda.is_available():
        raise SimparError("--backend nccl: no CUDA GPU is visible on this machine (torch.cuda.is_available() "
                          "is False); calibrate CPU ranks with --backend gloo")
    props = torch.cuda.get_device_properties(0)
    preset = preset or preset_for(props.name, props.total_memory)
    if preset not in GPUS:
        raise SimparError(f"--gpu: cannot tell which datasheet {props.name!r} is; name one of {', '.join(GPUS)}")
    machine = {**machine_id(), "name": props.name, "sms": props.multi_processor_count,
               "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", 0),
               "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
               "eager_kernel_interval_s": gpu_bench.eager_interval()}
    gemms = gpu_bench.megatron_gemms()
    say(f"{len(gemms)} GEMM shapes of Megatron layers on {props.name}")
    gemm_rows = gpu_bench.gemm_seconds(gemms)
    say("streaming kernels by size")
    stream_rows = gpu_bench.stream_seconds()
    world = torch.cuda.device_count()
    if world > 1:
        say(f"NCCL all-reduce by size over {world} GPUs")
        ranks = launch(gpu_bench.allreduce_worker, world, (), backend="nccl", timeout=timeout)
        rows = [{"bytes": r["bytes"], "seconds": max(rank[i]["seconds"] for rank in ranks)}
                for i, r in enumerate(ranks[0])]
        nccl = fit_allreduce(rows, world)
    else:
        nccl = {"skipped": f"one GPU visible ({props.name}): NCCL collectives need two or more"}
    return fit_profile(machine, preset, gemm_rows, stream_rows, nccl)
