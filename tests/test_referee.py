"""simpar/referee.py: what a validate's own noise lets it judge, computed from planted runs and prices."""

import math
from statistics import NormalDist

import pytest

from simpar import validate
from simpar.referee import (CONFIDENT, describe, describe_whole, pass_chance, pooled_sd, resolution, whole,
                             whole_chance)


def test_the_pooled_spread_is_of_log_times_weighted_by_degrees_of_freedom():
    # logs 0 and 0.1 (variance 0.005, 1 dof); logs 0, 0.2, 0.4 of 2 s (variance 0.04, 2 dof)
    groups = [[1.0, math.exp(0.1)], [2.0, 2 * math.exp(0.2), 2 * math.exp(0.4)], [5.0]]
    assert pooled_sd(groups) == pytest.approx(math.sqrt((0.005 + 2 * 0.04) / 3))
    assert pooled_sd([[1.0], [2.0]]) is None


def test_without_noise_an_exact_model_always_meets_the_goal_and_with_much_it_never_does():
    assert pass_chance(0.0, 3, 7) == 1.0
    assert pass_chance(1.0, 3, 7) < 0.01


def test_one_case_one_run_matches_the_normal_law():
    sd = 0.08  # within 10 %: exp(-x) - 1 in [-0.1, 0.1], x in [-ln 1.1, -ln 0.9]
    expected = NormalDist(0, sd).cdf(-math.log(0.9)) - NormalDist(0, sd).cdf(-math.log(1.1))
    assert pass_chance(sd, 1, 1, median_within=0.10) == pytest.approx(expected, abs=0.01)


def test_more_runs_and_calibrations_judge_more_finely():
    assert pass_chance(0.08, 9, 7) > pass_chance(0.08, 3, 7) + 0.2
    assert pass_chance(0.08, 3, 7, price_sd=0.08, calibrations=3) < pass_chance(0.08, 3, 7) - 0.1


def test_resolution_reads_both_spreads_and_the_runs_that_would_suffice():
    runs = [[0.030, 0.033, 0.036]] * 7
    prices = [[0.031, 0.032, 0.033]] * 7
    found = resolution(runs, prices)
    assert found["run_sd"] == pytest.approx(pooled_sd(runs)) and found["price_sd"] == pytest.approx(pooled_sd(prices))
    assert (found["runs"], found["calibrations"], found["cases"]) == (3, 3, 7)
    assert found["priced_chance"] == pass_chance(found["run_sd"], 3, 7, found["price_sd"], 3)
    needed = found["repeats_for"]
    assert pass_chance(found["run_sd"], needed, 7, found["price_sd"], needed) >= 0.9
    assert pass_chance(found["run_sd"], needed - 1, 7, found["price_sd"], needed - 1) < 0.9
    assert "7 cases" in describe(2, found) and f"{needed} runs a case" in describe(2, found)
    assert resolution([[0.03]] * 7) == {}  # one run a case: no spread
    assert "price_sd" in resolution(runs) and "priced_chance" not in resolution(runs)


def test_validate_prices_each_case_with_each_profile_of_the_window(monkeypatch):
    priced = []
    monkeypatch.setattr(validate, "price", lambda p, s, g, prec: priced.append((p, s, g)) or 0.03 * p)
    cases = [{"strategy": s, "gpus": g, "real_runs_s": [0.03, 0.031, 0.029]} for s in ("ddp", "tp") for g in (2, 4)]
    found = validate.resolutions(cases, [1.0, 1.1], "fp32")
    assert sorted(found) == [2, 4] and len(priced) == 8
    assert found[2]["price_sd"] == pytest.approx(pooled_sd([[0.03, 0.033]] * 2))
    alone = validate.resolutions(cases, [1.0], "fp32")  # one profile: the runs' spread alone
    assert alone[2]["price_sd"] is None and len(priced) == 8


def test_the_report_says_what_the_window_can_judge(tmp_path):
    case = {"strategy": "ddp", "gpus": 2, "sim_step_s": 0.03, "real_step_s": 0.033, "error": -0.09, "spread": 0.2,
            "bytes_exact": True, "memory_exact": True, "real_runs_s": [0.03, 0.033, 0.036]}
    result = validate.summary([case])
    result["resolution"] = {2: resolution([case["real_runs_s"]])}
    report = tmp_path / "r.md"
    validate.write_report(report, "hw.json", [case], result)
    assert "What this window's own noise lets it judge" in report.read_text()
    assert describe(2, result["resolution"][2]) in report.read_text()


def _world(run_sd, cases, runs=3, price_sd=None, calibrations=0):
    return {"run_sd": run_sd, "cases": cases, "runs": runs, "price_sd": price_sd, "calibrations": calibrations}


def test_the_whole_goal_of_one_run_is_the_normal_law_at_its_median_bound():
    # one case, one run: no spread, so within max(15 %, 0) and a median within 10 %: the stricter 10 % holds
    sd = 0.08
    expected = NormalDist(0, sd).cdf(-math.log(0.9)) - NormalDist(0, sd).cdf(-math.log(1.1))
    assert whole_chance([_world(sd, 1, runs=1)], priced=False) == pytest.approx(expected, abs=0.01)
    assert whole_chance([_world(0.0, 21)], priced=False) == 1.0


def test_a_case_s_own_spread_widens_what_it_may_miss_by():
    # the same draws (one world, the same seed): the spread allowance can only let more windows through
    sd = 0.15
    bound_alone = pass_chance(sd, 3, 7, within=0.15, median_within=0.10)
    with_spread = whole_chance([_world(sd, 7)], priced=False)
    assert with_spread > bound_alone + 0.05


def test_the_whole_window_needs_two_world_sizes_and_says_the_runs_that_would_suffice():
    assert whole({}) == {} and whole({2: _world(0.09, 7)}) == {}
    found = {2: _world(0.09, 7, price_sd=0.07, calibrations=3), 4: _world(0.08, 7, price_sd=0.05, calibrations=3),
             8: _world(0.06, 7, price_sd=0.05, calibrations=3)}
    over = whole(found)
    assert (over["worlds"], over["cases"], over["runs"]) == ([2, 4, 8], 21, 3)
    assert over["exact_chance"] > over["priced_chance"]
    needed = over["repeats_for"]
    worlds = list(found.values())
    assert whole_chance(worlds, needed) >= CONFIDENT > whole_chance(worlds, needed - 1)
    assert "all 21 cases (2, 4, 8 ranks)" in describe_whole(over) and f"{needed} runs a case" in describe_whole(over)
    unpriced = whole({2: _world(0.09, 7), 4: _world(0.08, 7)})
    assert "priced_chance" not in unpriced and "priced with" not in describe_whole(unpriced)


def test_the_report_says_what_the_whole_window_can_judge(tmp_path):
    cases = [{"strategy": "ddp", "gpus": g, "sim_step_s": 0.03, "real_step_s": 0.033, "error": -0.09, "spread": 0.2,
              "bytes_exact": True, "memory_exact": True, "real_runs_s": [0.03, 0.033, 0.036]} for g in (2, 4)]
    result = validate.summary(cases)
    result["resolution"] = {g: resolution([c["real_runs_s"]]) for g, c in zip((2, 4), cases)}
    result["resolution_whole"] = whole(result["resolution"])
    report = tmp_path / "r.md"
    validate.write_report(report, "hw.json", cases, result)
    assert describe_whole(result["resolution_whole"]) in report.read_text()
