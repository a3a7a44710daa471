"""The machine ``--compare-real`` runs its ranks on: --hardware, or this machine's cached profile, measured
quickly the first time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from simpar.calibrate import QUICK_PASSES, add_worlds, calibrate, default_path, quick_worlds
from simpar.calibrate.profile import VERSION, HardwareProfile
from simpar.cli.common import is_gpu_profile
from simpar.errors import SimparError
from simpar.scenario import Scenario


def machine_topology(args, scenario: Scenario, calibrate_now: bool = True):
    """The machine the ranks run on: --hardware, else this machine's cached profile (``simpar calibrate``'s, or
    the worlds it lacks measured now, under half a minute, and cached for the next run); with a line saying which.
    Without ``calibrate_now`` (a rank under torchrun, inside its process group, whose machines may be several)
    a missing profile is priced with simpar's rough built-in CPU figures instead, and the line says so."""
    world, precision = scenario.cluster.gpus, scenario.train.precision
    path = args.hardware or str(default_path(precision))
    if is_gpu_profile(path):
        raise SimparError("--hardware: a GPU profile prices simulated GPU clusters; --compare-real runs these "
                          "ranks on this machine's CPU and needs a CPU profile (simpar calibrate) or none")
    if args.hardware is None:
        cached, missing = measured_worlds(path), missing_worlds(path, world)
        if missing and not calibrate_now and not cached:
            from simpar.real.cpu_profile import cpu_topology

            return cpu_topology(world), ("no profile of this machine: the simulator priced this run with simpar's "
                                         "rough built-in CPU figures (run 'simpar calibrate' first for measured ones)")
        if missing and calibrate_now:
            _measure(path, precision, *missing, cached=bool(cached))
    profile = HardwareProfile.load(path)
    kind = "a quick calibration" if profile.machine.get("quick") else "simpar calibrate"
    note = f"the simulator priced this run with the hardware profile {path} ({kind}: micro-benchmarks of this machine)"
    return profile.topology(world, precision), note


def measured_worlds(path: str) -> set[int]:
    """The worlds the profile at ``path`` measured; none where there is no profile of this simpar there."""
    try:
        data = json.loads(Path(path).read_text())
        return {int(w) for w in data.get("ring", {})} if data.get("version") == VERSION else set()
    except (OSError, ValueError, AttributeError):
        return set()


def missing_worlds(path: str, world: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The worlds (in full, light: ``quick_worlds``) a run of ``world`` ranks needs that the cached profile at
    ``path`` has not measured (all of them where there is none); None where none is missing."""
    measured = measured_worlds(path)
    full, light = (tuple(w for w in worlds if w not in measured) for worlds in quick_worlds(world))
    return (full, light) if full or light else None


def _measure(path: str, precision: str, full: tuple[int, ...], light: tuple[int, ...], cached: bool) -> None:
    """A quick calibration of the worlds missing from the ``cached`` profile at ``path`` (all of it where there is
    none), saved there, with a progress bar."""
    worlds = ", ".join(map(str, sorted(full + light)))
    print(f"no profile of this machine for {worlds} ranks yet: measuring it (under half a minute; 'simpar "
          f"calibrate' takes the full profile)", file=sys.stderr)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    stages = len(full) + len(light) + (0 if cached else QUICK_PASSES)
    with tqdm(total=stages, desc="calibrating", unit="stage", file=sys.stderr, disable=None) as bar:
        tick = lambda message: bar.update()  # noqa: E731
        if cached:
            profile = add_worlds(HardwareProfile.load(path), precision, full, light, progress=tick)
        else:
            profile = calibrate(precision, full, quick=True, light=light, progress=tick)
        profile.save(path)
