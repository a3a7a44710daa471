"""The machine ``--compare-real`` runs its ranks on: --hardware, or this machine's cached profile, measured
quickly the first time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from simpar.calibrate import calibrate, default_path, quick_worlds
from simpar.calibrate.profile import VERSION, HardwareProfile
from simpar.cli.common import is_gpu_profile
from simpar.errors import SimparError
from simpar.scenario import Scenario


def machine_topology(args, scenario: Scenario, calibrate_now: bool = True):
    """The machine the ranks run on: --hardware, else this machine's cached profile (``simpar calibrate``'s, or
    a quick one measured now, about half a minute, and cached for the next run); with a line saying which.
    Without ``calibrate_now`` (a rank under torchrun, inside its process group, whose machines may be several)
    a missing profile is priced with simpar's rough built-in CPU figures instead, and the line says so."""
    world, precision = scenario.cluster.gpus, scenario.train.precision
    path = args.hardware or str(default_path(precision))
    if is_gpu_profile(path):
        raise SimparError("--hardware: a GPU profile prices simulated GPU clusters; --compare-real runs these "
                          "ranks on this machine's CPU and needs a CPU profile (simpar calibrate) or none")
    if args.hardware is None and not usable(path, world):
        if not calibrate_now:
            from simpar.real.cpu_profile import cpu_topology

            return cpu_topology(world), ("no profile of this machine: the simulator priced this run with simpar's "
                                         "rough built-in CPU figures (run 'simpar calibrate' first for measured ones)")
        worlds = quick_worlds(world)
        print(f"no profile of this machine for {world} ranks yet: measuring it ({', '.join(map(str, worlds))} ranks, "
              f"about half a minute; 'simpar calibrate' takes the full one)", file=sys.stderr)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with tqdm(total=len(worlds) + 1, desc="calibrating", unit="stage", file=sys.stderr, disable=None) as bar:
            calibrate(precision, worlds, quick=True, progress=lambda message: bar.update()).save(path)
    profile = HardwareProfile.load(path)
    kind = "a quick calibration" if profile.machine.get("quick") else "simpar calibrate"
    note = f"the simulator priced this run with the hardware profile {path} ({kind}: micro-benchmarks of this machine)"
    return profile.topology(world, precision), note


def usable(path: str, world: int) -> bool:
    """Whether the cached profile at ``path`` is of this simpar and measured the ranks a run of ``world`` needs
    (the largest it measured covers the worlds a quick calibration would not measure: ``quick_worlds``)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return False
    measured = [int(w) for w in data.get("ring", {})]
    return bool(measured) and (world in measured or max(measured) >= max(quick_worlds(world)))
