"""``simpar calibrate``: micro-benchmark this machine and save a hardware profile for the simulator."""

from __future__ import annotations

import sys

from simpar import units
from simpar.cli.common import add_json_flag, write_json
from simpar.errors import SimparError


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
    p.add_argument("--quick", action="store_true",
                   help="gloo: fewer models, batches and repeats (about 20 s at 2 and 4 ranks): what "
                        "--compare-real measures when this machine has no profile yet")
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
    profile = calibrate(precision, worlds, repeats, progress=lambda m: print(f"calibrating: {m}", file=sys.stderr),
                        quick=args.quick)
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
    t = units.human_time
    print(f"hardware profile of {profile.machine['host']} ({profile.machine['cores']} cores, torch "
          f"{profile.machine['torch']}), {precision}{', ' + what if what else ''}: saved to {path}")
    for phase, label in (("fwd", "forward"), ("bwd", "backward")):
        *overheads, rate = profile.compute[precision][phase]
        per_kind = ", ".join(f"{kind} {t(o)}" for kind, o in zip(UNIT_KINDS, overheads))
        scores = (profile.attention_scores.get(precision) or (0.0, 0.0))[phase == "bwd"]
        per_kind += f" + {1e9 * scores:.2f} ns per attention score of a layer" if scores else ""
        print(f"  {label:<10} overhead {per_kind}; FLOPs at {rate / 1e9:,.2f} GFLOP/s")
    print(f"  optimizer  Adam {profile.optimizer_params_per_s['adam'] / 1e6:,.0f} M params/s on a bare tensor, "
          f"copies {units.human_rate(profile.copy_bytes_per_s)}")
    if profile.optimizer_step.get(precision):
        overhead, rate = profile.optimizer_step[precision]
        print(f"  step op    {t(overhead)} + parameters at {rate / 1e6:,.0f} M params/s (the executor's Adam step)")
    for kind, (per_tensor, per_element) in (profile.handling.get(precision) or {}).items():
        print(f"  handling   {kind or 'all-reduce':<10} {1e6 * per_tensor:.2f} us per tensor + "
              f"{1e9 * per_element:.2f} ns per element of a data-parallel call's data")
    print("  ranks  ring step          wake   wake after 24 units  resume  after recv  handoff  late recv  "
          "Worker-Server leg")
    for world in sorted(int(k) for k in profile.ring):
        w = str(world)
        alpha, bandwidth = profile.ring[w]
        phases, extras = profile.wake_curve.get(w, [[0.0], [0.0]])
        leg = profile.worker_server.get(w, [0.0, 0.0, 1.0])
        print(f"  {world:>5}  {t(alpha):>8} {units.human_rate(bandwidth):>10}  {t(profile.wake.get(w, 0.0)):>8}  "
              f"{t(profile.wake.get(w, 0.0) + extras[-1]):>14}  {t(profile.resume.get(w, 0.0)):>8}  "
              f"{t(profile.resume_after_recv.get(w, 0.0)):>9}  {t(profile.handoff.get(w, 0.0)):>8}  "
              f"{t(profile.late_recv.get(w, 0.0)):>8}  {t(leg[1]):>8} {units.human_rate(leg[2]):>10}")
    return 0


def run_gpu(args) -> int:
    from simpar.calibrate import gpu_default_path
    from simpar.costs.gpu_profile import calibrate_gpu
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
    if "fp8_gemms" in profile.samples:
        print(f"  FP8 GEMMs         efficiency {k['fp8_gemm_efficiency']:.3f} of the FP8 peak (preset "
              f"{preset.for_fp8().gemm_efficiency:.3f}); {len(profile.samples['fp8_gemms'])} shapes, model vs "
              f"measured: median {fit['fp8_gemm_median_abs_error']:.1%}, max {fit['fp8_gemm_max_abs_error']:.1%}")
    else:
        print(f"  FP8 GEMMs         not measured: {fit.get('fp8_skipped', 'this profile has none')}")
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
