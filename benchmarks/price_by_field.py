"""Which calibrated quantity moves a validate case's price between two profiles.

    python benchmarks/price_by_field.py A.json B.json [--strategy zero3] [--gpus 2]

Simulates the case (``simpar validate``'s scenario) with profile A, with profile B, then with A
with one top-level field at a time set to B's, and prints each field's effect in milliseconds. The
effects need not add up to B - A (the fields act together), but the largest names the measurement
a price rests on: between the fastest and the slowest after-round profiles of the thirty-first
stop's validates, ZeRO-3's `series_level` moved it +40.3 ms of 56.5 (docs/calibration.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError
from simpar.sim import simulate
from simpar.validate import STRATEGIES, case_scenario

_SKIPPED = ("samples", "machine", "version")  # what the simulator never reads, or must stay A's


def price_ms(profile: HardwareProfile, strategy: str, gpus: int) -> float:
    topology = profile.topology(gpus, "fp32")
    return simulate(case_scenario(strategy, gpus, "fp32"), topology=topology, serial=True).step_time_s * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="a CPU profile from 'simpar calibrate' (the base)")
    parser.add_argument("b", help="another CPU profile (each field taken from it in turn)")
    parser.add_argument("--strategy", default="zero3", choices=STRATEGIES)
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    try:
        a, b = HardwareProfile.load(args.a), HardwareProfile.load(args.b)
        if not (isinstance(a, HardwareProfile) and isinstance(b, HardwareProfile)):
            raise SimparError("both profiles must be CPU-rank profiles (simpar calibrate), not GPU ones")
        base, other = price_ms(a, args.strategy, args.gpus), price_ms(b, args.strategy, args.gpus)
    except SimparError as exc:
        print(f"price_by_field: {exc}", file=sys.stderr)
        return 2
    print(f"{args.strategy} at {args.gpus} ranks: A {base:.1f} ms, B {other:.1f} ms ({other - base:+.1f})")
    effects = []
    for field in (f.name for f in dataclasses.fields(a)):
        if field in _SKIPPED or getattr(a, field) == getattr(b, field):
            continue
        swapped = dataclasses.replace(a, **{field: getattr(b, field)})
        effects.append((price_ms(swapped, args.strategy, args.gpus) - base, field))
    for effect, field in sorted(effects, key=lambda e: -abs(e[0])):
        print(f"  {field:24s} {effect:+8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
