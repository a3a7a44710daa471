"""The calibration's own phase loops against the price the simulator gives their calls.

    python benchmarks/loop_price.py [PROFILE ...]

``phase_worker``'s loops (calibrate/bench.py) time an all-reduce after 1, 4, 8, 16 and 32 units of compute, the
ring's of ``PHASE_SIZE`` bytes and the Worker-Server's of the pattern's largest size. The simulator prices a call
after a compute from other measurements: the ring's steps and the first call's wake (``pattern_worker``), plus the
loops' rise from their first loop (``wake_curve``). This prints, per profile (this machine's cached one by default)
and world, each loop's measured call beside that price, and their mean difference: what the composition leaves
of the level the loops themselves measured, which the calibration now keeps as ``later_steps`` (calibrate/lag.py)
and charges to a ring call's steps after its first; the price printed leaves it out. Nothing is fitted. On the fortieth stop (2026-11-29) the ring's
loops read above their price at 2 ranks in 19 of 21 calibrations of seven validate windows (+0.64 ms on
average), the Worker-Server's both ways (7 of 21 above, -0.20 ms on average; docs/calibration.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from simpar.calibrate import PATTERN_SIZES, default_path
from simpar.calibrate.fits import ring_price
from simpar.calibrate.profile import PHASE_SIZE, HardwareProfile
from simpar.errors import SimparError


def loop_rows(topology, phases: list[float], calls: list[float], steps: float, algo: str) -> list[tuple]:
    """[(compute before the call, the call measured, the call priced)] for one set of loops: ``steps`` the
    price of the call's steps (or legs), plus what the topology charges a call of ``algo`` after that compute."""
    return [(phase, call, steps + topology.collective_wake(phase, algo)) for phase, call in zip(phases, calls)]


def profile_rows(raw: dict, profile: HardwareProfile) -> dict[tuple[str, str], list[tuple]]:
    """{(world, "ring" or "ps"): ``loop_rows``} for every world whose calibration kept its phase loops."""
    out = {}
    for world, shared in raw.get("samples", {}).get("shared", {}).items():
        loops = shared.get("phases")
        if not loops or world not in raw.get("ring", {}):
            continue
        topology = profile.topology(int(world), next(iter(profile.compute)))
        alpha, bandwidth = raw["ring"][world]
        steps = ring_price("allreduce", PHASE_SIZE, int(world), alpha, bandwidth)
        out[(world, "ring")] = loop_rows(topology, loops["phase_s"], loops["call_s"], steps, "ring")
        if loops.get("ps") and world in raw.get("worker_server", {}):
            _, leg, rate = raw["worker_server"][world]
            legs = ring_price("psreduce", PATTERN_SIZES[-1], int(world), leg, rate)
            out[(world, "ps")] = loop_rows(topology, loops["ps"]["phase_s"], loops["ps"]["call_s"], legs, "ps")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="*", help="CPU profiles from 'simpar calibrate' (default: the cached one)")
    args = parser.parse_args()
    for path in args.profiles or [str(default_path("fp32"))]:
        try:
            with open(path) as f:
                raw = json.load(f)
            profile = HardwareProfile.load(path)
        except (OSError, ValueError, SimparError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
        rows = profile_rows(raw, profile)
        if not rows:
            print(f"{path}: no phase loops kept (a profile older than its samples, or a GPU's)")
        for (world, algo), loops in sorted(rows.items()):
            cells = "  ".join(f"{1e3 * phase:5.1f} ms: {1e3 * call:4.2f}/{1e3 * priced:4.2f}"
                              for phase, call, priced in loops)
            gap = statistics.fmean(call - priced for _, call, priced in loops)
            print(f"{path} {world} ranks {algo:<4} measured/priced  {cells}  | mean {1e3 * gap:+.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
