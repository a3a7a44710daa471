"""The host's speed read off the spinners (simpar/real/host_speed.py): the traces, the reading over a
stretch, what a run and a calibration record, and validate's step times at the window's speed."""

import os
import time

import pytest

from simpar.calibrate.average import average_profiles
from simpar.real import awake, host_speed
from simpar.real.host_speed import Trace, reading, relative
from simpar.validate import at_window_speed, window_speed

from test_calibrate_average import _profile


def test_a_trace_parses_its_lines_and_drops_one_cut_short_by_the_kill():
    trace = Trace.parse(1, "10.0 0.5 1000\n10.1 0.55 3000\n10.2 0.6")
    assert trace.core == 1 and trace.samples == [(10.0, 0.5, 1000), (10.1, 0.55, 3000)]


def test_a_reading_counts_the_intervals_overlapping_the_stretch_per_core_then_averages_the_cores():
    # core 0: 5000 iterations per 0.05 CPU s (100 k/s) over [1, 3]; the intervals after it are left out
    core0 = Trace(0, [(1.0, 0.00, 0), (2.0, 0.05, 5000), (3.0, 0.10, 10000), (4.0, 0.15, 99000), (5.0, 0.2, 0)])
    # core 1 runs twice as fast, in two traces (two launches) that are summed
    core1a = Trace(1, [(1.0, 0.0, 0), (1.5, 0.05, 10000)])
    core1b = Trace(1, [(2.0, 5.0, 10), (2.5, 5.05, 10010)])
    assert core0.within(1.0, 3.0) == (10000, pytest.approx(0.10))
    assert reading(1.0, 3.0, [core0, core1a, core1b]) == pytest.approx((100e3 + 200e3) / 2)
    # a stretch shorter than the samples' interval is read over the interval around it
    assert core0.within(1.2, 1.3) == (5000, pytest.approx(0.05))
    # a core whose spinner hardly ran is not read; nothing read at all is None
    assert reading(1.0, 3.0, [core0, Trace(1, [(1.0, 0.0, 0), (2.0, 0.001, 5)])]) == pytest.approx(100e3)
    assert reading(10.0, 20.0, [core0]) is None and reading(1.0, 3.0, []) is None


def test_relative_is_unknown_where_either_speed_is():
    assert relative(3.0, 2.0) == 1.5
    assert relative(None, 2.0) is None and relative(3.0, None) is None


def test_the_spinners_record_how_fast_their_cores_ran(monkeypatch):
    monkeypatch.delenv(awake.ENV, raising=False)
    monkeypatch.setattr(host_speed, "_TRACES", [])
    with awake.cores_kept_awake():
        t0 = time.time()
        time.sleep(0.6)  # this process idles: the spinners get the cores
        t1 = time.time()
    cores = sorted(os.sched_getaffinity(0))
    assert sorted(t.core for t in host_speed._TRACES) == cores
    speed = reading(t0, t1)
    assert speed is not None and speed > 1e5  # a Python loop: millions of iterations a second
    assert reading(t1 + 10, t1 + 20) is None  # no spinner ran then


def test_an_averaged_profile_is_at_the_harmonic_mean_of_the_speeds():
    fast, slow = _profile(1.0), _profile(3.0)
    fast.machine["host_speed"], slow.machine["host_speed"] = 3.0, 1.0
    # mean of the times: (1/3 + 1) / 2 = 2/3 of a unit of work at speed 1, so the speed 1.5
    assert average_profiles([fast, slow], ["a", "b"]).machine["host_speed"] == pytest.approx(1.5)
    slow.machine.pop("host_speed")
    assert average_profiles([fast, slow], ["a", "b"]).machine["host_speed"] is None


def test_validate_sets_each_run_at_the_windows_speed():
    runs = [{"step_time_s": 0.030, "host_speed": 1.0},  # ran at half the window's speed: 15 ms at its speed
            {"step_time_s": 0.020, "host_speed": 2.0},
            {"step_time_s": 0.010, "host_speed": 4.0}]
    assert window_speed(runs) == pytest.approx(3 / (1 + 0.5 + 0.25))  # the speed of their mean step
    out = at_window_speed(runs, 2.0)
    assert out["host_speeds"] == [0.5, 1.0, 2.0]
    assert out["real_at_window_speed_s"] == pytest.approx(0.020)
    assert out["speed_spread"] == pytest.approx((0.020 - 0.015) / 0.020)
    unread = runs[:2] + [{"step_time_s": 0.01}]
    assert window_speed(unread) is None and at_window_speed(unread, 2.0) == {} and at_window_speed(runs, None) == {}


def test_validate_prices_every_case_against_the_runs_at_the_speed_of_them_all(monkeypatch):
    import simpar.validate as validate

    speeds = iter([1.0, 3.0, 9.0, 1.0, 3.0, 9.0])  # ddp's runs, then tp's, then 4-rank tp's, in rounds
    monkeypatch.setattr(validate, "measure", lambda *case: {"step_time_s": 0.02, "host_speed": next(speeds)})
    monkeypatch.setattr(validate.os, "cpu_count", lambda: 2)
    seen = []
    monkeypatch.setattr(validate, "judge", lambda profile, *case: seen.append(case[-1]) or case[:2])
    validate.run_cases(_profile(1.0), [("ddp", 2), ("tp", 2), ("tp", 4)], "fp32", 3, 60.0, repeats=2)
    # 4 / (1 + 1/3 + 1 + 1/3); the 4-rank case outnumbers the 2 cores: neither read nor counted in the window
    assert seen == [pytest.approx(1.5), pytest.approx(1.5), None]
    assert validate.read_at_speed(2, cores=2) and not validate.read_at_speed(3, cores=2)


def test_the_summary_and_report_give_the_error_at_the_windows_speed_over_the_cases_read(tmp_path):
    import simpar.validate as validate

    case = {"strategy": "ddp", "gpus": 4, "sim_step_s": 0.030, "real_step_s": 0.036, "error": -1 / 6, "spread": 0.3,
            "bytes_exact": True, "memory_exact": True, "real_runs_s": [0.030, 0.036, 0.040]}
    at_speed = {**case, "strategy": "tp", "gpus": 2, "host_speeds": [0.8, 0.85, 0.9], "real_at_window_speed_s": 0.031,
                "speed_error": -1 / 31, "speed_spread": 0.1}
    result = validate.summary([at_speed])
    assert result["median_abs_speed_error"] == pytest.approx(1 / 31) and result["median_speed_spread"] == 0.1
    both = validate.summary([case, at_speed])  # the 4-rank case was not read: the figures are the 2-rank case's
    assert both["speed_cases"] == 1 and both["max_abs_speed_error"] == pytest.approx(1 / 31)
    report = tmp_path / "v.md"
    validate.write_report(report, "hw.json", [case, at_speed], both)
    text = report.read_text()
    assert "At the window's speed" in text and "1 of 2 cases" in text and "median |error| 3.2 %" in text
    assert "| tp | 2 | 30.0 ms | 36.0 ms | -16.7 % | 30 % |" in text
    assert "| 31.0 ms | -3.2 % | 10 % | 0.80, 0.85, 0.90 |" in text
    assert "| - | - | - | not read: more ranks than cores |" in text
    assert "speed_error" in (tmp_path / "v.csv").read_text()
    validate.write_report(report, "hw.json", [case], validate.summary([case]))
    assert "window's speed" not in report.read_text()


def test_the_speed_reading_benchmark_measures_what_the_reading_accounts_for():
    bench = _benchmark("speed_reading")
    speeds = [1.0, 1.25, 0.8, 2.0]
    exact = bench.per_case([0.02 / s for s in speeds], speeds)  # every step goes as the speed
    assert exact["corr"] == pytest.approx(1.0) and exact["slope"] == pytest.approx(1.0)
    assert exact["spread_at_speed"] == pytest.approx(0.0, abs=1e-12) and exact["spread_raw"] > 0.3
    unrelated = bench.per_case([0.02, 0.03, 0.02, 0.03], [1.0, 1.0, 2.0, 2.0])
    assert unrelated["corr"] == pytest.approx(0.0, abs=1e-12) and unrelated["spread_at_speed"] > unrelated["spread_raw"]


@pytest.mark.slow
def test_compare_real_sets_the_runs_speed_against_the_profiles(tmp_path, cli):
    import json

    profile = _profile(1.0)
    profile.machine.update(host="x", kept_awake=True, host_speed=1e7)
    path = tmp_path / "hw.json"
    profile.save(str(path))
    # eight steps: a reading needs MIN_CPU_S of the spinners' time within the timed steps, which two short
    # steps on a loaded CI machine did not always leave them (a CI run read None)
    out = json.loads(cli("run", "--strategy", "ddp", "--gpus", "2", "--steps", "8", "--compare-real", "--hardware",
                         str(path), "--json", "-").stdout)
    assert out["host_speed"]["profile"] == 1e7
    assert out["host_speed"]["relative"] == pytest.approx(out["real"]["host_speed"] / 1e7)
    text = cli("run", "--strategy", "ddp", "--gpus", "2", "--steps", "8", "--compare-real", "--hardware",
               str(path)).stdout
    assert "x as fast over the timed steps as while the profile was calibrated" in text


def _benchmark(name: str):
    """benchmarks/<name>.py, loaded as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_compute_after_call_benchmark_reads_each_skew_by_the_compute_after_the_call():
    """Two ranks' [(compute after, entry, exit)]: per length, the exit skew of the calls it follows, the entry
    skew and times of the calls after it."""
    bench = _benchmark("compute_after_call")
    a = [(1.0, 0.0, 2.0), (2.0, 3.0, 5.0), (1.0, 7.5, 9.0), (2.0, 10.0, 12.0)]
    b = [(1.0, 0.0, 2.5), (2.0, 4.0, 5.0), (1.0, 7.0, 10.0), (2.0, 10.0, 13.0)]
    rows = bench.by_compute_after(a, b)
    assert list(rows) == [1.0, 2.0]
    # after 1: the calls at 0 and 2 left 0.5 and 1.0 apart; the next (1 and 3) entered 1.0 and 0.0 apart
    assert rows[1.0]["exit skew"] == (0.75, 0.75) and rows[1.0]["next entry skew"] == (0.5, 0.5)
    assert rows[1.0]["next from the later entry"] == (2.0, 2.0)  # 5 - 4 and 13 - 10
    assert rows[1.0]["next per rank"] == (2.0, 2.0)  # (2 + 1) / 2 and (2 + 3) / 2
    assert rows[2.0] == {"exit skew": (0.0, 0.0), "next entry skew": (0.5, 0.5),
                         "next from the later entry": (2.5, 2.5), "next per rank": (2.25, 2.25)}


def test_the_calls_in_step_benchmark_groups_each_call_by_the_compute_before_it():
    from simpar.models import model
    from simpar.plan import Collective, Compute
    from simpar.scenario import make_scenario
    from simpar.strategies import build_plan

    bench = _benchmark("calls_in_step")
    scenario = make_scenario(model("tiny"), "tp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    ops = build_plan(scenario).program_of(0).ops
    kind = scenario.model.unit_kind
    calls = [i for i, op in enumerate(ops) if isinstance(op, Collective)]
    assert bench.group_of(ops, calls[0], kind) == "call after fwd embedding"
    assert bench.group_of(ops, calls[1], kind) == "call after fwd layer attn"
    maxima = next(i for i in calls if ops[i].payload.startswith("logits max"))
    assert bench.group_of(ops, maxima + 1, kind) == "call after a call"  # the sums' all-reduce
    computes = [op.id for op in ops if isinstance(op, Compute)]
    priced = {op.id: 0.001 for op in ops}
    measured = [(ops, priced, {i: 0.002 for i in calls + computes})] * 2  # two ranks
    rows = bench.grouped(measured, kind)
    attn = rows["call after fwd layer attn"]
    assert attn == {"ops": model("tiny").layers, "priced": 0.001, "measured": 0.002}
    assert sum(row["ops"] for row in rows.values()) == len(calls) + len(computes)



def test_the_calls_in_step_benchmark_groups_zero3_calls_by_their_place_in_a_series():
    """``--by-place``: tiny-deep's ZeRO-3 step opens with ten gathers before the embedding's forward (the
    first, three of the second to fourth, five of the fifth on, and the last); after each layer's backward
    comes a reduce-scatter first, then gathers; every op lands in one group (computes as ``group_of``)."""
    from simpar.models import model
    from simpar.plan import Collective, Compute
    from simpar.scenario import make_scenario
    from simpar.strategies import build_plan

    bench = _benchmark("calls_in_step")
    scenario = make_scenario(model("tiny-deep"), "zero3", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    ops = build_plan(scenario).program_of(0).ops
    kind = scenario.model.unit_kind
    calls = [i for i, op in enumerate(ops) if isinstance(op, Collective)]
    opening = [bench.place_of(ops, i, kind) for i in calls[:10]]
    assert opening == (["allgather after step's first, 1"] + ["allgather after step's first, 2-4"] * 3
                       + ["allgather after step's first, 5+"] * 5 + ["allgather after step's first, last"])
    scatters = {bench.place_of(ops, i, kind) for i in calls if ops[i].op == "reducescatter"}
    assert "reducescatter after bwd, 1" in scatters
    computes = [op.id for op in ops if isinstance(op, Compute)]
    priced = {op.id: 0.001 for op in ops}
    rows = bench.grouped([(ops, priced, {i: 0.002 for i in calls + computes})], kind, bench.place_of)
    assert rows["allgather after fwd, last"]["ops"] == 9  # before the 2nd-9th units' forwards, the head's backward
    assert sum(row["ops"] for row in rows.values()) == len(calls) + len(computes)


def test_the_series_against_step_benchmark_reads_the_steps_calls_by_place_after_a_layers_compute():
    """With each op's time its bytes: after a layer's backward the first call is always its reduce-scatter
    (every layer's the same size), then the gathers; after a layer's forward the first is a gather of a
    layer's first module (512 bytes); the embedding's and head's series are left out; an op the rank did not
    time is left out."""
    from simpar.calibrate.series import series_scenario
    from simpar.plan import Collective
    from simpar.strategies import build_plan

    bench = _benchmark("series_against_step")
    scenario = series_scenario(2, "fp32")
    ops = build_plan(scenario).programs[0].ops
    sizes = {op.id: float(op.nbytes) for op in ops if isinstance(op, Collective)}
    backward = bench.step_places(ops, sizes, scenario.model.unit_kind, "bwd")
    forward = bench.step_places(ops, sizes, scenario.model.unit_kind, "fwd")
    scatter = next(op for op in ops if isinstance(op, Collective) and op.op == "reducescatter" and len(op.pieces) == 8)
    assert len(backward) == 9 and backward[0] == scatter.nbytes  # a layer's eight modules' gradients
    assert len(forward) == 8 and forward[0] == 512.0
    assert bench.step_places(ops, {}, scenario.model.unit_kind, "bwd") == []


def test_the_series_in_pieces_benchmark_splits_the_repetitions_by_time():
    """Repetitions 0.125 s apart, pieces of 3 s: 24 a piece (a piece ends at the first repetition 3 s or more
    after its first), and a last piece of fewer than 20 is dropped."""
    bench = _benchmark("series_in_pieces")
    marks = [[0.125 * i, 0.125 * i + 0.01] for i in range(64)]
    assert bench.pieces(marks, 3.0) == [(0, 24), (24, 48)]
    assert bench.pieces(marks, 10.0) == [(0, 64)]
    assert bench.pieces(marks[:10], 3.0) == []


def test_the_own_pace_benchmark_sets_each_ranks_own_time_against_its_core_alone():
    bench = _benchmark("own_pace")
    # two rounds; rank 1's core twice as slow; together each rank at its own pace, the barrier at the slower's
    rank0 = [{"alone0": 1.0, "alone1": 2.0, "own": 1.0, "all": 2.2}] * 2
    rank1 = [{"alone0": 1.0, "alone1": 2.0, "own": 2.0, "all": 2.2}] * 2
    s = bench.summary([rank0, rank1])
    assert s["rounds"] == 2 and s["alone"] == pytest.approx(1.5) and s["own"] == pytest.approx(1.5)
    assert s["slowest"] == 2.0 and s["own_over_alone"] == pytest.approx(1.0)
    assert s["all_over_own"] == pytest.approx(2.2 / 1.5)


def test_the_resume_benchmark_sets_each_compute_after_a_call_against_it_without_calls():
    bench = _benchmark("resume_after_call")
    # two ranks: the forward pays 1 more after a call on rank 0 and 3 on rank 1; the products nothing
    rank0 = {"forward": {"alone": [4.0, 4.0], "after": [5.0, 5.0]}, "products": {"alone": [2.0], "after": [2.0]}}
    rank1 = {"forward": {"alone": [6.0], "after": [9.0]}, "products": {"alone": [2.0], "after": [2.0]}}
    s = bench.summary([rank0, rank1])
    assert s["forward"] == pytest.approx((14 / 3, 19 / 3, 5 / 3))
    assert s["products"] == (2.0, 2.0, 0.0)


def test_the_call_entries_benchmark_splits_a_call_where_its_last_rank_enters():
    """Three ranks' logs of (step, op id, start, end): the first step is left out; per later step the entry
    spread, each rank's mean lag behind the last in, the mean time from that entry to each rank's end, and the
    spread of the ends; only the steps every rank logged count."""
    bench = _benchmark("call_entries")
    logs = [[(0, 7, 0.0, 9.0), (1, 7, 10.0, 16.0), (2, 7, 20.0, 25.0), (1, 3, 0.0, 1.0)],
            [(0, 7, 0.0, 9.0), (1, 7, 12.0, 17.0), (2, 7, 20.0, 26.0)],
            [(0, 7, 0.0, 9.0), (1, 7, 13.0, 15.0), (2, 7, 23.0, 27.0), (3, 7, 30.0, 31.0)]]
    rows = bench.entries(logs, 7)
    assert rows == [(3.0, pytest.approx(4 / 3), pytest.approx(3.0), 2.0),  # entries 10, 12, 13; ends 16, 17, 15
                    (3.0, 2.0, pytest.approx(3.0), 2.0)]  # entries 20, 20, 23; ends 25, 26, 27
    assert bench.entries(logs, 3) == []  # an op only one rank logged
