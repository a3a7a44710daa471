"""``simpar calibrate``: micro-benchmark this machine and save a hardware profile for the simulator."""

from __future__ import annotations

import sys

from simpar import units
from simpar.cli import add_json_flag, write_json
from simpar.errors import SimparError


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine and save a hardware profile",
                       description="Micro-benchmarks (unit forward/backward by size, ring steps by message size "
                                   "and number of ranks, optimizer steps, copies), fitted into a profile that "
                                   "'simpar run --hardware PATH' and '--compare-real' price Plans with.")
    p.add_argument("--backend", default="gloo", help="gloo (CPU ranks; the only one calibrated so far)")
    p.add_argument("--gpus", default="2,4,8", help="numbers of ranks to measure side by side (default 2,4,8)")
    p.add_argument("--precision", default="fp32", help="fp32 (default) or bf16-mixed")
    p.add_argument("--repeats", default="10", help="runs per timed round (5 rounds, median; default 10)")
    p.add_argument("--out", help="where to save the profile (default: this machine's cache, used by "
                                 "--compare-real)")
    add_json_flag(p, "the profile")
    p.set_defaults(handler=run)


def parse_worlds(text: str, flag: str, minimum: int = 1) -> tuple[int, ...]:
    worlds = tuple(units.positive_int(part, flag, minimum=minimum) for part in text.split(",") if part.strip())
    if not worlds:
        raise SimparError(f"{flag}: give one or more numbers of ranks, e.g. 2,4,8")
    return worlds


def run(args) -> int:
    from simpar.calibrate import calibrate, default_path  # imports torch: only when asked
    from simpar.calibrate.profile import UNIT_KINDS

    if args.backend.strip().lower() != "gloo":
        raise SimparError("--backend: only gloo (CPU ranks) can be calibrated so far")
    precision = args.precision.strip().lower()
    if precision not in ("fp32", "bf16-mixed"):
        raise SimparError(f"--precision: must be fp32 or bf16-mixed, got {args.precision!r}")
    worlds = parse_worlds(args.gpus, "--gpus", minimum=2)  # ranks side by side: a ring needs two
    repeats = units.positive_int(args.repeats, "--repeats")
    profile = calibrate(precision, worlds, repeats, progress=lambda m: print(f"calibrating: {m}", file=sys.stderr))
    path = args.out or str(default_path(precision))
    if not args.out:
        default_path(precision).parent.mkdir(parents=True, exist_ok=True)
    profile.save(path)
    if args.json and write_json(profile.__dict__, args.json):
        return 0
    compute = profile.compute[precision]
    print(f"hardware profile of {profile.machine['host']} ({profile.machine['cores']} cores, torch "
          f"{profile.machine['torch']}), {precision}: saved to {path}")
    for phase, label in (("fwd", "forward"), ("bwd", "backward")):
        *overheads, rate = compute[phase]
        per_kind = ", ".join(f"{kind} {units.human_time(o)}" for kind, o in zip(UNIT_KINDS, overheads))
        print(f"  {label:<10} overhead {per_kind}; FLOPs at {rate / 1e9:,.2f} GFLOP/s")
    print(f"  optimizer  Adam {profile.optimizer_params_per_s['adam'] / 1e6:,.0f} M params/s, "
          f"copies {units.human_rate(profile.copy_bytes_per_s)}")
    print("  ranks   compute slowdown   ring step: latency   bandwidth")
    for world in sorted(int(k) for k in profile.ring):
        alpha, bandwidth = profile.ring[str(world)]
        print(f"  {world:>5}   {profile.slowdown[str(world)]:>14.2f}x   {units.human_time(alpha):>17}"
              f"   {units.human_rate(bandwidth):>9}")
    return 0
