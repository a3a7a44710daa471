"""benchmarks/noise_floor.py's oracles: what they count as a miss is computed, not assumed."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("noise_floor", Path(__file__).parents[1] / "benchmarks" / "noise_floor.py")
noise_floor = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(noise_floor)


def test_a_drift_every_case_shares_is_the_window_level_not_a_miss():
    # every case 30 % slower in the last three rounds: the pooled oracle misses there, the level oracle does not
    levels = [1.0, 1.0, 1.0, 1.0, 1.3, 1.3, 1.3]
    runs = {"a": [0.030 * x for x in levels], "b": [0.050 * x for x in levels], "c": [0.080 * x for x in levels]}
    errors, lines = noise_floor.level_oracle(runs)
    assert len(errors) == 5  # windows of three runs
    assert all(abs(e) < 1e-12 for window in errors for e in window.values())
    assert "5/5" in lines[0]
    pooled = noise_floor.oracle_report(runs)
    assert any(line.startswith("windows in which the oracle holds every case") and "3/5" in line for line in pooled)


def test_one_case_alone_off_is_a_miss_of_that_case():
    runs = {"a": [0.030] * 5, "b": [0.050] * 5, "c": [0.080, 0.080, 0.080, 0.100, 0.100]}
    errors, lines = noise_floor.level_oracle(runs)
    # window 3 (runs 3-5): c's median is 0.100 against its pooled 0.080, the others at their level
    assert errors[2]["c"] == pytest.approx(0.25)
    assert errors[2]["a"] == pytest.approx(0.0) and errors[0]["c"] == pytest.approx(0.0)
    assert "2/3" in lines[0]
