"""Several calibrations of one machine merged into one profile: ``simpar calibrate --average P1,P2,...``.

A calibration is a snapshot of a machine whose state moves. On the 2-core development VM two
calibrations 45 minutes apart timed the same units alone 35-53 % apart, and priced the same 21
``validate`` runs (taken between them) at median |error| 8.7 % (16 of 21 short) and 14.6 % (13 of 21
long); their average priced those runs at 7.9 % (docs/calibration.md). A constant of the model is its
typical value, so a profile for judging runs spread over an hour is best fitted over that hour:
calibrate before and after (or every so often) and average.

Every fitted figure is averaged as the time it stands for: figures in seconds (overheads, latencies,
wakes, work between ops) and time factors (the compute slowdown, the wake's growth per second) by
their mean; rates (FLOP/s, bytes/s, parameters/s) by the mean of their reciprocals, the seconds per
unit of work, so that the averaged profile prices a piece of work at the mean of what the profiles price
it at.
"""

from __future__ import annotations

from dataclasses import replace

from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError

# fields (and positions inside their lists) that hold a rate, averaged as seconds per unit of work
_RATE_FIELDS = ("optimizer_params_per_s", "copy_bytes_per_s")
_RATE_LAST = ("compute",)  # [overhead per unit kind..., FLOP/s]
_RATE_SECOND = ("ring", "optimizer_step")  # [seconds, rate]
_RATE_THIRD = ("worker_server",)  # [seconds, seconds, rate]
_AVERAGED = ("compute", "slowdown", "ring", "optimizer_params_per_s", "copy_bytes_per_s", "wake", "resume",
             "handoff", "handoff_step", "send_issue", "resume_after_recv", "wake_growth", "wake_curve", "wake_phase",
             "between_ops", "resume_unit", "worker_server_curve", "optimizer_step", "tensor_work", "embedding_table",
             "worker_server", "wake_short", "sharded_work", "attention_scores", "late_recv", "late_recv_busy",
             "series_late", "series_last", "series_level", "series_first", "scatter_level", "unit_cold", "tp_piece",
             "step_concat", "resume_short", "step_concat_cold", "optimizer_tensor", "resume_tail", "later_steps",
             "send_issue_spread")


_UNIT_FIT = ("compute", "embedding_table", "attention_scores", "unit_cold")  # fitted together (fit_compute)
_STEP_FIT = ("optimizer_step",)  # without the gradients' concatenation where a profile timed it apart (step_concat)


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
    """Each profile's ``name``; a table some profiles lack (empty: calibrated before simpar measured it)
    is averaged over those that have it, not refused. The units' fit comes from the profiles that fitted the
    cold caches apart (``unit_cold``) where any did: the overheads of one fitted without them hold part of
    them, and averaged in they would be paid twice; so does an optimizer step fitted with its gradients'
    concatenation in it, beside profiles that timed the concatenation apart (``step_concat``)."""
    if name in _UNIT_FIT and any(p.unit_cold for p in profiles):
        profiles = [p for p in profiles if p.unit_cold]
    if name in _STEP_FIT and any(p.step_concat for p in profiles):  # likewise: the others' step holds it
        profiles = [p for p in profiles if p.step_concat]
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
        if profile.short_size != profiles[0].short_size:  # wake_short is a call's cost less its bytes' price
            raise SimparError(f"--average: {path} timed its short loops' calls at {profile.short_size} bytes, "
                              f"{paths[0]} at {profiles[0].short_size}: recalibrate the older one")
        if profile.machine.get("kept_awake", False) != profiles[0].machine.get("kept_awake", False):
            raise SimparError(f"--average: {path} and {paths[0]} were calibrated one with the cores kept awake, "
                              f"one without (SIMPAR_KEEP_AWAKE): their calls cost different things")
        if profile.machine.get("gloo_batch", False) != profiles[0].machine.get("gloo_batch", False):
            raise SimparError(f"--average: {path} and {paths[0]} were calibrated one with gloo's transport threads "
                              f"at SCHED_BATCH, one without (SIMPAR_GLOO_BATCH): their calls cost different things")
    fields = {name: _merge(name, _measured(profiles, name), name, common) for name in _AVERAGED}
    samples = {"averaged_from": list(paths), "each": [p.samples for p in profiles]}
    shared = [p.samples.get("shared", {}) for p in profiles]
    worlds = [w for w in shared[0] if all("back_to_back" in s.get(w, {}) for s in shared)]
    if worlds:  # the back-to-back ring step, kept for the table calibrate prints beside the step's pattern
        samples["shared"] = {w: {"back_to_back": _merge("ring", [s[w]["back_to_back"] for s in shared], w)}
                             for w in worlds}
    # the speed the averaged times were taken at: a time goes as one over the speed, so the speed of a mean
    # of times is the harmonic mean of the speeds (host_speed.py; unknown if any profile lacks it)
    speeds = [p.machine.get("host_speed") for p in profiles]
    speed = len(speeds) / sum(1.0 / s for s in speeds) if all(speeds) else None
    return replace(profiles[0], samples=samples, machine={**profiles[0].machine, "host_speed": speed}, **fields)
