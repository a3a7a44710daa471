"""A CPU profile with some of its terms taken out: each set to what the simulator assumes without it (no such
cost), so ``benchmarks/ablation.py`` can price recorded runs without it and tell whether it earns its place."""

from __future__ import annotations

from dataclasses import fields, replace

from simpar.calibrate.profile import HardwareProfile

# the fitted terms (docs/calibration.md, "The CPU model"); the units' compute and the ring step are the model's base
TERMS = ("optimizer_step", "attention_scores", "handling", "wake", "wake_curve", "wake_short", "later_steps",
         "resume", "resume_after_recv", "handoff", "late_recv", "worker_server")


def without(profile: HardwareProfile, terms: list[str]) -> HardwareProfile:
    """``profile`` with ``terms`` (of ``TERMS``) at their defaults."""
    defaults = {f.name: f for f in fields(HardwareProfile)}
    return replace(profile, **{name: defaults[name].default_factory() for name in terms})
