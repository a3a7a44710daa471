"""The first ``--compare-real`` on a machine measures a quick profile, caches it per host and torch version, and
reuses it: which worlds it measures, where it is cached, when a cached one will do."""

import json
import os

import pytest

from simpar.calibrate import default_path, quick_worlds
from simpar.calibrate.profile import VERSION
from simpar.cli.machine import missing_worlds


def test_a_quick_calibration_measures_two_ranks_and_the_run_s_own_world(monkeypatch):
    """In full where the ranks fit twice the cores; light beyond (at most 8 ranks a core): a call's cost there
    grows with the ranks in a way no smaller world predicts."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert quick_worlds(2) == ((2,), ()) and quick_worlds(3) == ((2, 3), ()) and quick_worlds(4) == ((2, 4), ())
    assert quick_worlds(16) == ((2,), (16,)) and quick_worlds(64) == ((2,), (16,))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert quick_worlds(16) == ((2, 16), ()) and quick_worlds(64) == ((2,), (64,))


def test_the_profile_is_cached_per_host_torch_version_and_precision(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("SIMPAR_CACHE", str(tmp_path))
    path = default_path("fp32")
    assert path.parent == tmp_path and torch.__version__ in path.name and path.name.endswith("-fp32.json")
    assert default_path("bf16-mixed") != path


@pytest.mark.parametrize("measured, world, missing", [
    (["2", "4"], 16, ((), (16,))), (["2"], 16, ((), (16,))), (["2", "16"], 16, None), (["2"], 2, None),
    (["2", "4"], 3, ((3,), ())), (["2", "4", "8"], 4, None), (["2", "16"], 64, None), ([], 4, ((2, 4), ()))])
def test_a_cached_profile_is_used_where_it_measured_the_worlds_a_run_needs(tmp_path, monkeypatch, measured, world,
                                                                            missing):
    """Only the worlds a run needs and the cached profile lacks are measured (and added to it)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"version": VERSION, "ring": {w: [1e-3, 1e9] for w in measured}}))
    assert missing_worlds(str(path), world) == missing
    path.write_text(json.dumps({"version": VERSION - 1, "ring": {"2": [1e-3, 1e9], "4": [1e-3, 1e9]}}))
    assert missing_worlds(str(path), 2) == ((2,), ())  # another simpar's profile: measured again
    assert missing_worlds(str(tmp_path / "none.json"), 4) == ((2, 4), ())


def test_a_world_measured_again_replaces_its_terms_and_keeps_the_others(monkeypatch):
    """A light world measures the collectives' terms only: what it did not measure must not be left over from an
    earlier measurement of that world, and the other worlds stay as they were."""
    from simpar import calibrate as calibration
    from simpar.calibrate.profile import HardwareProfile

    profile = HardwareProfile(machine={}, compute={}, ring={"2": [1.0, 1.0], "16": [2.0, 2.0]},
                              optimizer_params_per_s={}, copy_bytes_per_s=1.0, late_recv={"2": 1.0, "16": 5.0},
                              samples={"shared": {"16": {"old": 1}}})
    measured = {"ring": [3.0, 3.0], "wake": 0.5, "shared": {"pattern": []}}
    monkeypatch.setattr(calibration, "measure_world", lambda world, *a, light=False, **k: dict(measured))
    calibration.add_worlds(profile, "fp32", (), (16,))
    assert profile.ring == {"2": [1.0, 1.0], "16": [3.0, 3.0]} and profile.wake == {"16": 0.5}
    assert profile.late_recv == {"2": 1.0} and profile.samples["shared"]["16"] == {"pattern": []}


def test_auto_steps_run_about_three_seconds_of_steps_within_bounds():
    from simpar.cli.run_compare import AUTO_SECONDS, AUTO_STEPS, auto_steps

    assert AUTO_SECONDS == 3.0 and AUTO_STEPS == (3, 200)
    assert auto_steps(0.2) == 16 and auto_steps(0.05) == 61  # the warm-up and 3 s of timed steps
    assert auto_steps(10.0) == 3 and auto_steps(1e-3) == 200  # a long step: 3; a short one: at most 200


@pytest.mark.slow
def test_a_light_measurement_times_the_collectives_terms_only():
    """What a quick calibration measures of a world of many ranks a core, here at 2 ranks: the pattern's
    terms and the wake's curve over the light loops, no pipeline or tensor-parallel terms."""
    from simpar.calibrate import LIGHT_UNITS, QUICK_REPEATS, measure_world
    from simpar.calibrate.profile import PER_WORLD

    terms = measure_world(2, "fp32", QUICK_REPEATS, 120, light=True)
    assert set(terms) - {"shared"} == set(PER_WORLD) - {"wake_short", "resume_after_recv", "late_recv"}
    alpha, bandwidth = terms["ring"]
    assert alpha > 0 and bandwidth > 0 and len(terms["wake_curve"][0]) == len(LIGHT_UNITS)
    assert {row["calls"] for row in terms["shared"]["pattern"]} == {4}
