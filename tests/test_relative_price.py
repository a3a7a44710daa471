"""benchmarks/relative_price.py: the ratios it reads are computed, and a shared drift cancels."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("relative_price",
                                              Path(__file__).parents[1] / "benchmarks" / "relative_price.py")
relative_price = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(relative_price)


def test_every_case_takes_every_place():
    strategies = ["a", "b", "c"]
    orders = [relative_price.rotated(strategies, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert {order[0] for order in orders} == set(strategies)


def test_a_drift_both_cases_share_cancels():
    levels = [1.0, 1.3, 0.8, 1.1]
    runs = {"ddp": [0.035 * x for x in levels], "zero3": [0.185 * x for x in levels]}
    rows = relative_price.relative(runs, {"ddp": 0.035, "zero3": 0.185}, "ddp")
    assert rows["zero3"]["mean"] == pytest.approx(0.185 / 0.035)
    assert rows["zero3"]["sd"] == pytest.approx(0.0, abs=1e-12)
    assert rows["zero3"]["error"] == pytest.approx(0.0, abs=1e-12)
    assert rows["ddp"]["error"] == 0.0


def test_a_case_priced_short_reads_negative_with_its_spread():
    runs = {"ddp": [0.030, 0.040], "zero1": [0.033, 0.046]}  # ratios 1.10 and 1.15
    rows = relative_price.relative(runs, {"ddp": 0.030, "zero1": 0.030}, "ddp")
    row = rows["zero1"]
    assert row["ratios"] == pytest.approx([1.10, 1.15])
    assert row["mean"] == pytest.approx(1.125)
    assert row["error"] == pytest.approx(1.0 / 1.125 - 1)
    assert row["se"] == pytest.approx(0.025)  # SD of (1.10, 1.15), 0.0354, over sqrt(2)
    lines = relative_price.report(rows, "ddp")
    assert len(lines) == 3 and lines[2].startswith("| zero1 |") and "2/2" in lines[2]


def test_bad_base_is_named():
    with pytest.raises(SystemExit) as exit_:
        relative_price.main(["--strategies", "ddp,zero1", "--base", "tp"])
    assert exit_.value.code == 2
