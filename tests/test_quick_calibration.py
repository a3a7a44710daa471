"""The first ``--compare-real`` on a machine measures a quick profile, caches it per host and torch version, and
reuses it: which worlds it measures, where it is cached, when a cached one will do."""

import json
import os

import pytest

from simpar.calibrate import default_path, quick_worlds
from simpar.calibrate.profile import VERSION
from simpar.cli.machine import usable


def test_a_quick_calibration_measures_two_ranks_and_up_to_twice_the_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert quick_worlds(2) == (2,) and quick_worlds(3) == (2, 3) and quick_worlds(16) == (2, 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert quick_worlds(16) == (2, 16) and quick_worlds(64) == (2, 16)


def test_the_profile_is_cached_per_host_torch_version_and_precision(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("SIMPAR_CACHE", str(tmp_path))
    path = default_path("fp32")
    assert path.parent == tmp_path and torch.__version__ in path.name and path.name.endswith("-fp32.json")
    assert default_path("bf16-mixed") != path


@pytest.mark.parametrize("measured, world, ok", [(["2", "4"], 16, True), (["2"], 16, False), (["2"], 2, True),
                                                  (["2", "4"], 3, True)])
def test_a_cached_profile_is_used_where_it_measured_the_worlds_a_run_needs(tmp_path, monkeypatch, measured, world, ok):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"version": VERSION, "ring": {w: [1e-3, 1e9] for w in measured}}))
    assert usable(str(path), world) is ok
    path.write_text(json.dumps({"version": VERSION - 1, "ring": {"2": [1e-3, 1e9], "4": [1e-3, 1e9]}}))
    assert not usable(str(path), 2)  # another simpar's profile: measured again
    assert not usable(str(tmp_path / "none.json"), 2)
