"""``simpar calibrate``: micro-benchmark this machine and save a hardware profile for the simulator."""

from __future__ import annotations

import sys

from simpar import units
from simpar.cli import add_json_flag, write_json
from simpar.errors import SimparError
from simpar.spread import factor


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine and save a hardware profile",
                       description="Micro-benchmarks (unit forward/backward by size, ring steps by message size "
                                   "and number of ranks, optimizer steps, copies), fitted into a profile that "
                                   "'simpar run --hardware PATH' and '--compare-real' price Plans with.")
    p.add_argument("--backend", default="gloo",
                   help="gloo (CPU ranks, default) or nccl (this machine's CUDA GPU: GEMMs by shape, HBM, kernel "
                        "overhead, NCCL all-reduce across its GPUs, fitted into the GPU preset's kernel model)")
    p.add_argument("--gpu", help="nccl: the GPU preset whose datasheet the measurement refines (default: read "
                                 "from the device's name)")
    p.add_argument("--gpus", default="2,4,8", help="gloo: numbers of ranks to measure side by side (default 2,4,8)")
    p.add_argument("--precision", default="fp32", help="fp32 (default) or bf16-mixed")
    p.add_argument("--repeats", default="10", help="runs per timed round (5 rounds, median; default 10)")
    p.add_argument("--out", help="where to save the profile (default: this machine's cache, used by "
                                 "--compare-real)")
    p.add_argument("--average", metavar="P1,P2,...",
                   help="measure nothing: average these profiles of this machine (calibrations taken at different "
                        "times: its state moves by tens of percent within an hour) into one, saved to --out")
    add_json_flag(p, "the profile")
    p.set_defaults(handler=run)


def parse_worlds(text: str, flag: str, minimum: int = 1) -> tuple[int, ...]:
    worlds = tuple(units.positive_int(part, flag, minimum=minimum) for part in text.split(",") if part.strip())
    if not worlds:
        raise SimparError(f"{flag}: give one or more numbers of ranks, e.g. 2,4,8")
    return worlds


def run(args) -> int:
    if args.average is not None:
        return run_average(args)
    from simpar.calibrate import calibrate  # imports torch: only when asked

    backend = args.backend.strip().lower()
    if backend == "nccl":
        return run_gpu(args)
    if backend != "gloo":
        raise SimparError(f"--backend: must be gloo (CPU ranks) or nccl (CUDA GPUs), got {args.backend!r}")
    if args.gpu:
        raise SimparError("--gpu: names the GPU preset of --backend nccl; CPU ranks have none")
    precision = args.precision.strip().lower()
    if precision not in ("fp32", "bf16-mixed"):
        raise SimparError(f"--precision: must be fp32 or bf16-mixed, got {args.precision!r}")
    worlds = parse_worlds(args.gpus, "--gpus", minimum=2)  # ranks side by side: a ring needs two
    repeats = units.positive_int(args.repeats, "--repeats")
    profile = calibrate(precision, worlds, repeats, progress=lambda m: print(f"calibrating: {m}", file=sys.stderr))
    return _save_and_show(profile, args, precision)


def run_average(args) -> int:
    """``--average P1,P2,...``: the profiles' average, saved and shown like a calibration."""
    from simpar.calibrate.average import average_profiles
    from simpar.calibrate.profile import HardwareProfile

    paths = [part.strip() for part in args.average.split(",") if part.strip()]
    if len(paths) < 2:
        raise SimparError("--average: give two or more profiles, comma-separated (P1,P2,...)")
    if args.backend.strip().lower() != "gloo" or args.gpu:
        raise SimparError("--average: averages CPU-rank profiles; leave out --backend and --gpu")
    try:
        profiles = [HardwareProfile.load(path) for path in paths]
    except SimparError as exc:  # load names --hardware, its usual flag
        raise SimparError(f"--average: {str(exc).removeprefix('--hardware: ')}") from None
    profile = average_profiles(profiles, paths)
    precision = next(iter(profile.compute))
    return _save_and_show(profile, args, precision, f"the average of {len(paths)} profiles")


def _save_and_show(profile, args, precision: str, what: str = "") -> int:
    from simpar.calibrate import default_path
    from simpar.calibrate.fits import UNIT_KINDS

    path = args.out or str(default_path(precision))
    if not args.out:
        default_path(precision).parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    if args.json and write_json(profile.__dict__, args.json):
        return 0
    compute = profile.compute[precision]
    print(f"hardware profile of {profile.machine['host']} ({profile.machine['cores']} cores, torch "
          f"{profile.machine['torch']}), {precision}{', ' + what if what else ''}: saved to {path}")
    for phase, label in (("fwd", "forward"), ("bwd", "backward")):
        *overheads, rate = compute[phase]
        per_kind = ", ".join(f"{kind} {units.human_time(o)}" for kind, o in zip(UNIT_KINDS, overheads))
        table = profile.embedding_table.get(precision, 0.0) if phase == "bwd" else 0.0
        per_kind += f" + {1e9 * table:.2f} ns per element of its table" if table else ""
        scores = (profile.attention_scores.get(precision) or (0.0, 0.0))[phase == "bwd"]
        per_kind += f" + {1e9 * scores:.2f} ns per attention score of a layer" if scores else ""
        print(f"  {label:<10} overhead {per_kind}; FLOPs at {rate / 1e9:,.2f} GFLOP/s")
        cold = profile.unit_cold.get(precision)
        if cold:  # the once-a-step units' cold caches (calibrate/cold.py)
            paid = ", ".join(f"{kind} {units.human_time(s)}" for kind, s in cold[phase].items())
            print(f"  {'':<10} cold caches: {paid} more after a long gap since the last of its kind "
                  f"(1 - exp(-gap / {units.human_time(cold['tau'])}) of it)")
        pieces = profile.tp_piece.get(precision) or {}
        if pieces.get(phase) is not None:  # the executor's tensor-parallel pieces (calibrate/tp_bench.py)
            ends = ", ".join(f"{kind} +{units.human_time(pieces[f'{kind}_{phase}'])}" for kind in ("embedding", "head")
                             if f"{kind}_{phase}" in pieces)
            print(f"  {'':<10} a tensor-parallel piece of a layer: +{units.human_time(pieces[phase])} beyond its share "
                  f"of the layer" + (f"; the vocabulary-parallel {ends}" if ends else ""))
    print(f"  optimizer  Adam {profile.optimizer_params_per_s['adam'] / 1e6:,.0f} M params/s on a bare tensor"
          + (f" + {units.human_time(profile.optimizer_tensor)} per tensor beyond the first"
             if profile.optimizer_tensor else "") + f", copies {units.human_rate(profile.copy_bytes_per_s)}")
    if profile.optimizer_step.get(precision):
        overhead, rate = profile.optimizer_step[precision]
        print(f"  step op    {units.human_time(overhead)} + parameters at {rate / 1e6:,.0f} M params/s "
              "(the executor's Adam step inside its step: what the simulator prices)")
        if profile.step_concat.get(precision):
            per_tensor, per_element = profile.step_concat[precision]
            print(f"             + {1e6 * per_tensor:.2f} us per gradient tensor + {1e9 * per_element:.2f} ns per "
                  "element of those it holds, the gradients concatenated first (not by ZeRO-2 and 3)")
        if profile.step_concat_cold.get(precision):
            per_tensor, per_element = profile.step_concat_cold[precision]
            print(f"             ({1e6 * per_tensor:.2f} us + {1e9 * per_element:.2f} ns where no data-parallel call "
                  "handled them after the backward: tp, pp)")
    print(f"  executor   {1e6 * profile.between_ops:.1f} us of its own work between ops, per op of the plan")
    if profile.tensor_work.get(precision):
        per_tensor, per_element = profile.tensor_work[precision]
        print(f"             {1e6 * per_tensor:.1f} us per parameter tensor + {1e9 * per_element:.2f} ns per element "
              "handling a data-parallel collective's data (flatten, scale, re-point)")
    if (profile.sharded_work.get(precision) or {}).get("gather"):
        per_tensor, per_element = profile.sharded_work[precision]["gather"]
        print(f"             {1e6 * per_tensor:.1f} us per parameter tensor + {1e9 * per_element:.2f} ns per element "
              "copying ZeRO-1/2's gathered parameters into each")
    if (profile.sharded_work.get(precision) or {}).get("accumulate"):
        per_tensor, per_element = profile.sharded_work[precision]["accumulate"]
        print(f"             {1e6 * per_tensor:.2f} us per parameter tensor + {1e9 * per_element:.3f} ns per element "
              "adding a later micro-batch's gradients into the held ones (in its backward)")
    print("  ranks   compute slowdown   first compute after a call   after a pipeline receive   ring step in a step"
          "   bandwidth   first call after computing   + after longer compute before it   pipeline send after computing"
          "   its isend holds the sender   (ring step back to back)")
    for world in sorted(int(k) for k in profile.ring):
        alpha, bandwidth = profile.ring[str(world)]
        back = profile.samples.get("shared", {}).get(str(world), {}).get("back_to_back", [float("nan")])[0]
        unit = profile.resume_unit.get(str(world))
        on = f" of {units.human_time(unit)}" if unit else ""  # a shorter compute pays its share
        resume = "+" + units.human_time(profile.resume_cost(world)) + on
        if profile.resume_short.get(str(world)):  # and a short compute's, the curve's point on the way
            short, paid = profile.resume_short[str(world)]
            resume += f" (+{units.human_time(paid)} of {units.human_time(short)})"
        after_recv = "+" + units.human_time(profile.resume_after_recv_cost(world))
        print(f"  {world:>5}   {profile.slowdown[str(world)]:>14.2f}x   {resume:>26}   {after_recv:>24}"
              f"   {units.human_time(alpha):>19}   {units.human_rate(bandwidth):>9}"
              f"   {'+' + units.human_time(profile.wake_cost(world)):>26}"
              f"   {_growth(profile, world):>33}"
              f"   {'+' + units.human_time(profile.handoff_cost(world)):>29}"
              f"   {units.human_time(profile.send_issue.get(str(world), 0.0)):>26}   {units.human_time(back):>24}")
    for world in sorted(int(k) for k in profile.resume_tail):  # measured since the thirty-ninth stop
        print(f"  {world} ranks: every compute after the first one after a call, up to the next, "
              f"{100 * profile.resume_tail[str(world)]:.1f} % longer (the resume's tail)")
    for world in sorted(int(k) for k in profile.later_steps):  # measured since the fortieth stop
        print(f"  {world} ranks: a ring all-reduce's steps after its first, after a compute, "
              f"+{units.human_time(profile.later_steps[str(world)])} (the loops over their price)")
    for world in sorted(int(k) for k in profile.send_issue_spread):  # measured since the forty-first stop
        print(f"  {world} ranks: a pipeline send's isend holds its sender {_spread(profile, world)}, "
              "drawn send by send (simpar/spread.py)")
    if profile.worker_server and profile.wake_short:  # measured since the twelfth stop (older profiles lack them)
        print("  ranks   first call after a short compute, beyond its steps"
              "   Worker-Server all-reduce: first call after computing   each one-way leg   leg bandwidth"
              "   + after longer compute before it")
        for world in sorted(int(k) for k in profile.worker_server):
            wake, leg, rate = profile.worker_server[str(world)]
            points = profile.wake_short.get(str(world), ())
            short = ", ".join(f"{'-' if paid < 0 else '+'}{units.human_time(abs(paid))} after "
                              f"{units.human_time(compute)}" for compute, paid in points)
            grows = _growth(profile, world, "ps") if profile.worker_server_curve else "as the ring's"
            print(f"  {world:>5}   {short:>50}   {'+' + units.human_time(wake):>50}   {units.human_time(leg):>16}"
                  f"   {units.human_rate(rate):>13}   {grows:>33}")
    if profile.late_recv:  # measured since the fifteenth stop (series_late since the seventeenth)
        print("  ranks   pipeline receive posted after its send (beyond its bytes; gloo's rendezvous)"
              "   fifth and later calls of a series after computing, per ring step"
              "   ZeRO-3 gathers from a series' second on, per ring step   its first, beyond its steps"
              "   its last, before a compute")
        for world in sorted(int(k) for k in profile.late_recv):
            shift, level, last = (_signed(table.get(str(world))) for table in
                                  (profile.series_late, profile.series_level, profile.series_last))
            compute, extra = profile.series_first.get(str(world)) or (None, None)
            first = "-" if compute is None else f"{_signed(extra)} after {units.human_time(compute)}"
            print(f"  {world:>5}   {units.human_time(profile.late_recv[str(world)]):>78}   {shift:>64}   {level:>54}"
                  f"   {first:>30}   {last:>26}")
    if profile.late_recv_busy:  # measured since the forty-seventh stop: what the simulator reads where present
        print("  ranks   pipeline receive posted after its send, by the ranks computing while it waits"
              " (one pair, the others computing or idle)")
        for world in sorted(int(k) for k in profile.late_recv_busy):
            table = profile.late_recv_busy[str(world)]
            print(f"  {world:>5}   " + ", ".join(f"{units.human_time(table[k])} with {k} computing"
                                               for k in sorted(table, key=int)))
    return 0


def _spread(profile, world: int) -> str:
    """A send's hold at its median, 90th and 99th percentiles and its mean, as its spread and mean give them."""
    spread, mean = profile.send_issue_spread[str(world)], profile.send_issue.get(str(world), 0.0)
    at = [units.human_time(mean * factor({world: spread}, world, p)) for p in (0.5, 0.9, 0.99)]
    return f"median {at[0]}, p90 {at[1]}, p99 {at[2]}, mean {units.human_time(mean)}"


def _signed(seconds: float | None) -> str:
    """A measured shift as the table prints it: signed, or "-" where it was not measured."""
    return "-" if seconds is None else ("+" if seconds >= 0 else "-") + units.human_time(abs(seconds))


def _growth(profile, world: int, algo: str = "ring") -> str:
    """How a collective's wake grows with the compute before it, as the table prints it: an older profile's
    line, or the measured curve's rise to its longest compute (``algo`` "ps": the Worker-Server's)."""
    curve = profile.wake_curve_cost(world, algo)
    if curve:
        (first, *_, last), (*_, rise) = curve
        return f"+{units.human_time(rise)} from {units.human_time(first)} to {units.human_time(last)}"
    growth, phase = profile.wake_growth_cost(world)
    return f"+{units.human_time(growth * 1e-3)} a ms beyond {units.human_time(phase)}"


def run_gpu(args) -> int:
    from simpar.calibrate import calibrate_gpu, gpu_default_path
    from simpar.devices.presets import GPUS

    if args.gpu is not None and args.gpu not in GPUS:
        raise SimparError(f"--gpu: unknown GPU preset {args.gpu!r}; choose from {', '.join(GPUS)}")
    profile = calibrate_gpu(args.gpu, progress=lambda m: print(f"calibrating: {m}", file=sys.stderr))
    path = args.out or str(gpu_default_path(profile.preset))
    if not args.out:
        gpu_default_path(profile.preset).parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    if args.json and write_json(profile.__dict__, args.json):
        return 0
    k, fit, preset = profile.kernels, profile.fit, GPUS[profile.preset].kernels
    print(f"GPU profile of {profile.machine['name']} ({k['sms']} SMs, torch {profile.machine['torch']}, CUDA "
          f"{profile.machine['cuda']}), refining preset {profile.preset}: saved to {path}")
    print(f"  GEMM efficiency   {k['gemm_efficiency']:.3f} (preset {preset.gemm_efficiency:.3f}); "
          f"{len(profile.samples['gemms'])} Megatron shapes, model vs measured: median "
          f"{fit['gemm_median_abs_error']:.1%}, max {fit['gemm_max_abs_error']:.1%} (preset's constants: "
          f"median {fit['preset_gemm_median_abs_error']:.1%})")
    print(f"  HBM               {units.human_rate(fit['hbm_bandwidth'])} = {k['hbm_efficiency']:.3f} of the "
          f"datasheet (preset {preset.hbm_efficiency:.3f})")
    print(f"  kernel overhead   {units.human_time(k['kernel_overhead'])} (preset "
          f"{units.human_time(preset.kernel_overhead)}); streaming fit max error {fit['stream_max_abs_error']:.1%}")
    print(f"  eager launches    one kernel every {units.human_time(profile.machine['eager_kernel_interval_s'])} "
          f"from Python: steps of shorter kernels are CPU-bound (not modelled)")
    if "skipped" in profile.nccl:
        print(f"  NCCL              not measured: {profile.nccl['skipped']}")
    else:
        print(f"  NCCL all-reduce   {profile.nccl['world']} GPUs: bus bandwidth "
              f"{units.human_rate(profile.nccl['busbw_largest'])} at the largest size, latency "
              f"{units.human_time(profile.nccl['latency_s'])}")
    print(f"  use it: simpar run --hardware {path} --topology <a topology of {profile.preset} GPUs>")
    return 0
