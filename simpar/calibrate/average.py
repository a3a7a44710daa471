"""Several calibrations of one machine merged into one profile (``simpar calibrate --average P1,P2,...``): a
machine's state moves, so runs spread over an hour are best priced by calibrations spread over it. Seconds
average by their mean, rates by the mean of their seconds per unit of work, so the averaged profile prices a
piece of work at the mean of what the profiles price it at."""

from __future__ import annotations

from dataclasses import replace

from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError

# fields (and positions inside their lists) that hold a rate, averaged as seconds per unit of work
_RATE_FIELDS = ("optimizer_params_per_s", "copy_bytes_per_s")
_RATE_LAST = ("compute",)  # [overhead per unit kind..., FLOP/s]
_RATE_SECOND = ("ring", "optimizer_step")  # [seconds, rate]
_RATE_THIRD = ("worker_server",)  # [seconds, seconds, rate]
_AVERAGED = ("compute", "ring", "optimizer_params_per_s", "copy_bytes_per_s", "attention_scores", "optimizer_step",
             "handling", "wake", "wake_phase", "wake_curve", "wake_short", "later_steps", "resume",
             "resume_after_recv", "handoff", "late_recv", "worker_server")


def _mean(values: list[float], rate: bool) -> float:
    if rate and all(v > 0 for v in values):  # seconds per unit of work, averaged, then back to a rate
        return len(values) / sum(1.0 / v for v in values)
    return sum(values) / len(values)


def _merge(name: str, values: list, where: str, common: bool = False):
    """The average of one field's values across the profiles, of the same shape (``common``: tables keyed by
    world size averaged over the keys every profile has, the rest left out)."""
    first = values[0]
    if isinstance(first, dict):
        keys = set(first)
        if common:
            keys = keys.intersection(*values[1:]) or keys
            values = [{key: v[key] for key in first if key in keys} for v in values]
            first = values[0]
        for other in values[1:]:
            if set(other) != keys:
                raise SimparError(f"--average: the profiles differ in {where} ({', '.join(sorted(map(str, keys)))} "
                                  f"against {', '.join(sorted(map(str, other)))}); calibrate them with the same "
                                  "--gpus and --precision")
        return {key: _merge(name, [v[key] for v in values], f"{where}[{key}]", common) for key in first}
    if isinstance(first, list):
        if any(len(v) != len(first) for v in values):
            raise SimparError(f"--average: the profiles differ in the length of {where}")
        last = len(first) - 1
        if first and isinstance(first[0], list):  # a table of lists (wake_curve's phases and extras): each averaged
            return [_merge(name, [v[i] for v in values], f"{where}[{i}]", common) for i in range(len(first))]
        return [_mean([v[i] for v in values], (name in _RATE_LAST and i == last) or (name in _RATE_SECOND and i == 1)
                      or (name in _RATE_THIRD and i == 2))
                for i in range(len(first))]
    return _mean([float(v) for v in values], name in _RATE_FIELDS)


def _measured(profiles: list[HardwareProfile], name: str) -> list:
    """Each profile's ``name``; a table some profiles lack is averaged over those that have it, not refused."""
    values = [getattr(p, name) for p in profiles]
    if any(isinstance(v, dict) for v in values):
        return [v for v in values if v] or values[:1]
    return values


def average_profiles(profiles: list[HardwareProfile], paths: list[str], common: bool = False) -> HardwareProfile:
    """One profile whose every fitted figure is the average of ``profiles``' (same machine, same worlds
    and precisions; ``common``: only the world sizes and precisions they all have, as ``validate`` averages
    a profile of 2, 4 and 8 ranks with calibrations of the world sizes it runs); its samples keep each
    profile's, with the paths they came from."""
    if not profiles:
        raise SimparError("--average: give two or more profiles, comma-separated")
    for profile, path in zip(profiles, paths):
        if not isinstance(profile, HardwareProfile):
            raise SimparError(f"--average: {path} is a GPU profile; only CPU-rank profiles (simpar calibrate) average")
        if profile.machine.get("host") != profiles[0].machine.get("host"):
            raise SimparError(f"--average: {path} was calibrated on {profile.machine.get('host')!r}, "
                              f"{paths[0]} on {profiles[0].machine.get('host')!r}: average calibrations of one machine")
        if profile.machine.get("kept_awake", False) != profiles[0].machine.get("kept_awake", False):
            raise SimparError(f"--average: {path} and {paths[0]} were calibrated one with the cores kept awake, "
                              f"one without (SIMPAR_KEEP_AWAKE): their calls cost different things")
    fields = {name: _merge(name, _measured(profiles, name), name, common) for name in _AVERAGED}
    samples = {"averaged_from": list(paths), "each": [p.samples for p in profiles]}
    shared = [p.samples.get("shared", {}) for p in profiles]
    worlds = [w for w in shared[0] if all("back_to_back" in s.get(w, {}) for s in shared)]
    if worlds:  # the back-to-back ring step, kept for the table calibrate prints beside the step's pattern
        samples["shared"] = {w: {"back_to_back": _merge("ring", [s[w]["back_to_back"] for s in shared], w)}
                             for w in worlds}
    return replace(profiles[0], samples=samples, **fields)
