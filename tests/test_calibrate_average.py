"""``simpar calibrate --average``: calibrations of one machine taken at different times, merged into one
profile (seconds by their mean, rates by the mean of their seconds per unit of work)."""

import json

import pytest

from simpar.calibrate.average import average_profiles
from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate


def _profile(scale: float, host: str = "test", worlds=("2", "4")) -> HardwareProfile:
    """A profile of a machine ``scale`` times slower than the first: every time x scale, every rate / scale."""
    return HardwareProfile(machine={"host": host, "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6 * scale, 100e-6 * scale, 50e-6 * scale, 50e9 / scale],
                                             "bwd": [40e-6 * scale, 200e-6 * scale, 90e-6 * scale, 40e9 / scale]}},
                           ring={w: [1e-3 * scale, 2e9 / scale] for w in worlds},
                           optimizer_params_per_s={"adam": 1e8 / scale, "sgd": 4e8 / scale},
                           copy_bytes_per_s=1e10 / scale, wake={w: 3e-4 * scale for w in worlds},
                           resume={w: 2e-4 * scale for w in worlds},
                           optimizer_step={"fp32": [5e-4 * scale, 2e8 / scale]},
                           handling={"fp32": {"": [15e-6 * scale, 2e-9 * scale]}},
                           samples={"shared": {w: {"back_to_back": [5e-4 * scale, 1e9 / scale]} for w in worlds}})


def test_seconds_average_by_their_mean_and_rates_by_their_seconds_per_unit():
    fast, slow = _profile(1.0), _profile(3.0)
    merged = average_profiles([fast, slow], ["fast.json", "slow.json"])
    # seconds: the mean (x2 of the first); rates: the harmonic mean (1 / 2 of the first: seconds per unit x2)
    assert merged.compute["fp32"]["fwd"] == pytest.approx([40e-6, 200e-6, 100e-6, 25e9])
    assert merged.ring["4"] == pytest.approx([2e-3, 1e9])
    assert merged.optimizer_params_per_s == pytest.approx({"adam": 5e7, "sgd": 2e8})
    assert merged.copy_bytes_per_s == pytest.approx(5e9)
    assert merged.optimizer_step["fp32"] == pytest.approx([1e-3, 1e8])
    assert merged.handling["fp32"][""] == pytest.approx([30e-6, 4e-9])
    assert merged.wake["2"] == pytest.approx(6e-4) and merged.resume["4"] == pytest.approx(4e-4)
    assert merged.samples["averaged_from"] == ["fast.json", "slow.json"]
    assert merged.samples["shared"]["2"]["back_to_back"] == pytest.approx([1e-3, 5e8])


def test_a_piece_of_work_is_priced_at_the_mean_of_what_the_profiles_price_it_at():
    fast, slow = _profile(1.0), _profile(3.0)
    merged = average_profiles([fast, slow], ["a", "b"])
    flops = 7e6  # a layer's forward: overhead + flops / rate, linear in both, so the mean of the two
    fast_s, slow_s, merged_s = (p.compute["fp32"]["fwd"][1] + flops / p.compute["fp32"]["fwd"][-1]
                                for p in (fast, slow, merged))
    assert merged_s == pytest.approx((fast_s + slow_s) / 2)


def test_a_profile_averaged_with_itself_prices_every_strategy_as_it_does():
    profile = _profile(1.0)
    merged = average_profiles([profile, profile], ["a", "a"])
    for strategy in ("ddp", "zero3", "pp", "tp"):
        scenario = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, microbatches=4 if strategy == "pp" else 1,
                                 precision="fp32", topology="cpu-host")
        times = [simulate(scenario, topology=p.topology(2, "fp32"), serial=True).step_time_s for p in (profile, merged)]
        assert times[1] == pytest.approx(times[0], rel=1e-12)


def test_profiles_of_other_worlds_or_machines_do_not_average():
    with pytest.raises(SimparError, match="--average: the profiles differ in ring"):
        average_profiles([_profile(1.0), _profile(1.0, worlds=("2", "8"))], ["a", "b"])
    with pytest.raises(SimparError, match="--average: b was calibrated on 'other'"):
        average_profiles([_profile(1.0), _profile(1.0, host="other")], ["a", "b"])


def test_calibrate_average_saves_the_merged_profile_and_reports_bad_input(tmp_path, cli):
    paths = []
    for scale in (1.0, 3.0):
        paths.append(str(tmp_path / f"p{scale}.json"))
        _profile(scale).save(paths[-1])
    out = tmp_path / "avg.json"
    result = cli("calibrate", "--average", ",".join(paths), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "the average of 2 profiles" in result.stdout and str(out) in result.stdout
    merged = HardwareProfile.load(str(out))
    assert merged.ring["2"] == pytest.approx([2e-3, 1e9])
    assert json.loads(out.read_text())["samples"]["averaged_from"] == paths
    for args, message in [((paths[0],), "--average: give two or more profiles"),
                          ((f"{paths[0]},{tmp_path / 'missing.json'}",), "--average: cannot read"),
                          ((f"{paths[0]},{paths[1]}", "--backend", "nccl"), "--average: averages CPU-rank profiles")]:
        result = cli("calibrate", "--average", *args, "--out", str(out))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


def _fake_runs(monkeypatch, later):
    """validate's runs, calibrations and pricing replaced by recorders: (events, profiles priced with)."""
    import simpar.calibrate as calibrate
    import simpar.validate as validate

    events, priced = [], []
    monkeypatch.setattr(validate, "measure", lambda *case: events.append(("run", case[:2])) or {"step_time_s": 1.0})
    monkeypatch.setattr(calibrate, "calibrate",
                        lambda precision, worlds, progress=None: events.append(("calibrate", worlds)) or later.pop(0))
    monkeypatch.setattr(validate, "judge", lambda profile, *case: priced.append(profile) or case[:2])
    return events, priced


def test_validate_calibrate_after_prices_the_runs_with_the_average_of_the_profiles_around_them(monkeypatch, tmp_path):
    import simpar.validate as validate

    before, later = _profile(1.0), _profile(3.0)
    events, priced = _fake_runs(monkeypatch, [later])
    after_path = str(tmp_path / "v.after.json")
    pairs = [("ddp", 2), ("zero3", 4)]
    again = validate.Recalibrations(before, "before.json", "fp32", lambda index: after_path)
    validate.run_cases(before, pairs, "fp32", 3, 60.0, repeats=2, after=again.priced, after_round=again.after_round)
    # every run first, then one calibration of the profile's own world sizes; every case priced with the average
    assert events == [("run", p) for p in pairs] * 2 + [("calibrate", (2, 4))]
    assert all(p is priced[0] for p in priced) and len(priced) == 2
    assert priced[0].ring["2"] == pytest.approx([2e-3, 1e9])
    assert priced[0].samples["averaged_from"] == ["before.json", after_path]
    assert HardwareProfile.load(after_path).ring == later.ring  # the calibration after the runs is kept


def test_validate_calibrate_after_rounds_calibrates_after_every_round_and_averages_them_all(monkeypatch, tmp_path):
    import simpar.validate as validate

    before, later = _profile(1.0), [_profile(3.0), _profile(5.0), _profile(7.0)]
    rings = [p.ring for p in later]
    events, priced = _fake_runs(monkeypatch, later)
    pairs = [("ddp", 2), ("zero3", 4)]
    again = validate.Recalibrations(before, "before.json", "fp32", lambda i: str(tmp_path / f"r{i}.json"),
                                    every_round=True)
    validate.run_cases(before, pairs, "fp32", 3, 60.0, repeats=3, after=again.priced, after_round=again.after_round)
    assert events == ([("run", p) for p in pairs] + [("calibrate", (2, 4))]) * 3
    saved = [str(tmp_path / f"r{i}.json") for i in range(3)]
    assert priced[0].samples["averaged_from"] == ["before.json"] + saved
    assert priced[0].ring["2"] == pytest.approx([4e-3, 0.5e9])  # (1 + 3 + 5 + 7) / 4 ms; the rate by s/byte
    assert [HardwareProfile.load(path).ring for path in saved] == rings


def test_a_profile_from_outside_the_runs_window_only_sizes_them(monkeypatch, tmp_path):
    """A profile from before that is not of the runs' window (``before_in_window`` False: a cached calibration
    of hours before) is left out of the price: the calibrations among the runs alone, averaged (one: as it
    is); with no calibration taken it is all there is."""
    import simpar.validate as validate

    before, later = _profile(1.0), [_profile(3.0), _profile(5.0), _profile(7.0)]
    events, priced = _fake_runs(monkeypatch, later)
    again = validate.Recalibrations(before, "before.json", "fp32", lambda i: str(tmp_path / f"r{i}.json"),
                                    every_round=True, before_in_window=False)
    validate.run_cases(before, [("ddp", 2)], "fp32", 3, 60.0, repeats=3, after=again.priced,
                       after_round=again.after_round)
    saved = [str(tmp_path / f"r{i}.json") for i in range(3)]
    assert again.sources(before) == saved and priced[0].samples["averaged_from"] == saved
    assert priced[0].ring["2"] == pytest.approx([5e-3, 0.4e9])  # (3 + 5 + 7) / 3 ms; before's 1 ms left out
    events, priced = _fake_runs(monkeypatch, [later_one := _profile(3.0)])
    once = validate.Recalibrations(before, "before.json", "fp32", lambda i: str(tmp_path / "end.json"),
                                   before_in_window=False)
    validate.run_cases(before, [("ddp", 2)], "fp32", 3, 60.0, after=once.priced, after_round=once.after_round)
    assert priced[0] is later_one
    none_taken = validate.Recalibrations(before, "before.json", "fp32", str, before_in_window=False)
    assert none_taken.priced(before) is before and none_taken.sources(before) == ["before.json"]


def test_validate_counts_the_profile_from_before_only_if_it_was_saved_right_before(monkeypatch, tmp_path):
    """The CLI: a --hardware profile saved within BEFORE_WINDOW_S of the start is in the runs' window, an
    older one (its file's time) is not, and the report says which priced the cases."""
    import os
    import time

    import simpar.validate as validate
    from simpar.cli import main

    seen = []
    monkeypatch.setattr(validate, "run_cases", lambda *args, **kw: seen.append(kw) or [_case()])
    cpu = str(tmp_path / "cpu.json")
    _profile(1.0).save(cpu)
    out = ["--hardware", cpu, "--strategies", "ddp", "--gpus", "2", "--out", str(tmp_path / "v.md")]
    assert main(["validate", *out]) == 0 and seen[-1]["after_round"].__self__.before_in_window
    old = time.time() - validate.BEFORE_WINDOW_S - 60
    os.utime(cpu, (old, old))
    assert main(["validate", *out]) == 0 and not seen[-1]["after_round"].__self__.before_in_window


def test_validate_calibrates_only_the_world_sizes_it_runs_and_averages_those(monkeypatch, tmp_path):
    """A 2-rank validate beside a profile of 2 and 4 ranks: the calibrations among the runs are of 2 ranks
    alone, and the cases are priced with the average over 2 ranks (a plain --average of the two refuses)."""
    import simpar.validate as validate

    before, later = _profile(1.0), _profile(3.0, worlds=("2",))
    events, priced = _fake_runs(monkeypatch, [later])
    again = validate.Recalibrations(before, "before.json", "fp32", lambda i: str(tmp_path / f"r{i}.json"),
                                    every_round=True, worlds=(2,))
    validate.run_cases(before, [("ddp", 2)], "fp32", 3, 60.0, repeats=1, after=again.priced,
                       after_round=again.after_round)
    assert events == [("run", ("ddp", 2)), ("calibrate", (2,))]
    assert set(priced[0].ring) == {"2"} and priced[0].ring["2"] == pytest.approx([2e-3, 1e9])
    assert set(priced[0].wake) == {"2"} and priced[0].wake["2"] == pytest.approx(6e-4)  # 4 ranks left out
    with pytest.raises(SimparError, match="differ in"):
        average_profiles([before, later], ["before.json", "later.json"])


def test_validate_calibrates_the_world_sizes_it_runs_that_the_profile_lacks(monkeypatch, tmp_path):
    """A validate of 2 and 4 ranks beside a profile of 2 ranks alone (``simpar calibrate --gpus 2``): the
    calibrations among the runs are of 2 and 4 ranks, and the profile from before, which would price the
    4-rank cases with its 2-rank figures (and drop 4 ranks from the average), is left out of the price even
    though it was taken right before the runs."""
    import simpar.validate as validate

    before, later = _profile(1.0, worlds=("2",)), [_profile(3.0), _profile(5.0)]
    events, priced = _fake_runs(monkeypatch, later)
    saved = [str(tmp_path / f"r{i}.json") for i in range(2)]
    again = validate.Recalibrations(before, "before.json", "fp32", lambda i: saved[i], every_round=True,
                                    worlds=(2, 4))
    validate.run_cases(before, [("ddp", 2), ("ddp", 4)], "fp32", 3, 60.0, repeats=2, after=again.priced,
                       after_round=again.after_round)
    assert [e for e in events if e[0] == "calibrate"] == [("calibrate", (2, 4))] * 2
    assert not again.counts_before() and again.sources(before) == saved
    assert set(priced[0].ring) == {"2", "4"} and priced[0].ring["4"] == pytest.approx([4e-3, 0.5e9])


def test_the_report_names_the_calibration_after_the_runs(tmp_path):
    import simpar.validate as validate

    case = {"strategy": "ddp", "gpus": 2, "sim_step_s": 0.03, "real_step_s": 0.033, "error": -0.09, "spread": 0.2,
            "bytes_exact": True, "memory_exact": True, "real_runs_s": [0.03, 0.033, 0.036]}
    report = tmp_path / "v.md"
    validate.write_report(report, "hw.json", [case], validate.summary([case]), after="v.after.json")
    assert "averaged with the calibrations taken among the runs (`v.after.json`" in report.read_text()
    validate.write_report(report, "hw.json", [case], validate.summary([case]), after="v.after.json", before_too=False)
    assert "priced with the calibrations taken among the runs alone" in report.read_text()
    assert "only sized the runs" in report.read_text() and "per op class" not in report.read_text()
    classes = {"forward": [4.03e-3, 3.72e-3], "backward": [6.35e-3, 5.82e-3], "optimizer step": [1.92e-3, 1.76e-3],
               "collectives": [6.95e-3, 6.57e-3], "pipeline p2p": [0.0, 0.0], "offload copies": [0.0, 0.0]}
    validate.write_report(report, "hw.json", [{**case, "op_time_s": classes}], validate.summary([case]))
    text = report.read_text()  # where the step went, for the classes any case has
    assert "| strategy | ranks | forward | backward | optimizer step | collectives |" in text
    assert "| ddp | 2 | 4.03 / 3.72 | 6.35 / 5.82 | 1.92 / 1.76 | 6.95 / 6.57 |" in text


def test_a_table_one_profile_lacks_is_averaged_over_the_profiles_that_have_it():
    """A calibration from before simpar measured a figure (its table empty) averages with a newer one: the
    newer one's table is kept, not refused (validate --calibrate-after beside an old cached profile)."""
    older, newer = _profile(1.0), _profile(3.0)
    newer.handoff = {"2": 1e-3, "4": 2e-3}
    newer.late_recv = {"2": 1.2e-3}
    newer.worker_server = {"2": [1e-3, 2e-4, 4e9]}
    averaged = average_profiles([older, newer], ["older.json", "newer.json"])
    assert averaged.handoff == {"2": 1e-3, "4": 2e-3} and averaged.late_recv == {"2": 1.2e-3}
    assert averaged.worker_server == {"2": pytest.approx([1e-3, 2e-4, 4e9])}
    newest = _profile(1.0)
    newest.worker_server = {"2": [3e-3, 4e-4, 1e9]}  # seconds by their mean, a leg's rate as seconds per byte
    assert average_profiles([newer, newest], ["a", "b"]).worker_server == {"2": pytest.approx([2e-3, 3e-4, 1.6e9])}
    assert averaged.ring["2"] == pytest.approx([2e-3, 1e9])  # the others as before


def test_wake_curves_average_point_by_point():
    """Two calibrations' wake curves (the same loops: as many points): the compute before each call and
    its extra, each the mean of the two, by world size."""
    first, second = _profile(1.0), _profile(3.0)
    first.wake_curve = {"2": [[1e-3, 8e-3, 24e-3], [0.0, 1e-3, 2e-3]]}
    second.wake_curve = {"2": [[3e-3, 10e-3, 30e-3], [0.0, 2e-3, 2e-3]]}
    averaged = average_profiles([first, second], ["a", "b"])
    assert averaged.wake_curve["2"] == [pytest.approx([2e-3, 9e-3, 27e-3]), pytest.approx([0.0, 1.5e-3, 2e-3])]
    assert average_profiles([first, _profile(2.0)], ["a", "c"]).wake_curve == first.wake_curve  # one has none


def test_validate_calibrates_after_every_round_unless_told_otherwise(monkeypatch, tmp_path):
    """A CPU profile: calibrations among the runs by default ('rounds'), once at the end with the bare flag,
    none with 'none'; a GPU profile cannot be recalibrated here: none by default, an error when asked."""
    from pathlib import Path

    import simpar.validate as validate
    from simpar.cli import main

    seen = []
    monkeypatch.setattr(validate, "run_cases", lambda *args, **kw: seen.append(kw) or [_case()])
    cpu = str(tmp_path / "cpu.json")
    _profile(1.0).save(cpu)
    gpu = str(Path(__file__).parent.parent / "validation" / "profiles" / "h100-sxm-80gb-hbm3.json")
    out = ["--strategies", "ddp", "--gpus", "2", "--out", str(tmp_path / "v.md")]
    for extra, every_round in [((), True), (("--calibrate-after",), False), (("--calibrate-after", "rounds"), True),
                               (("--calibrate-after", "none"), None)]:
        assert main(["validate", "--hardware", cpu, *out, *extra]) == 0
        later = seen[-1]["after_round"]
        assert (later.__self__.every_round if later else None) == every_round, extra
    assert main(["validate", "--hardware", gpu, *out]) == 0 and seen[-1]["after_round"] is None
    assert main(["validate", "--hardware", gpu, "--calibrate-after", "end", *out]) == 2


def test_validate_without_calibrations_warns_of_world_sizes_the_profile_lacks(monkeypatch, tmp_path, capsys):
    import simpar.validate as validate
    from simpar.cli import main

    monkeypatch.setattr(validate, "run_cases", lambda *args, **kw: [_case()])
    cpu = str(tmp_path / "cpu.json")
    _profile(1.0, worlds=("2",)).save(cpu)
    out = ["--hardware", cpu, "--strategies", "ddp", "--out", str(tmp_path / "v.md"), "--calibrate-after", "none"]
    assert main(["validate", *out, "--gpus", "2,4,8"]) == 0
    assert "not calibrated for 4, 8 ranks" in capsys.readouterr().err
    assert main(["validate", *out, "--gpus", "2"]) == 0
    assert "not calibrated" not in capsys.readouterr().err


def _case() -> dict:
    return {"strategy": "ddp", "gpus": 2, "sim_step_s": 0.03, "real_step_s": 0.033, "error": -0.09, "spread": 0.2,
            "bytes_exact": True, "memory_exact": True, "real_runs_s": [0.03, 0.033, 0.036]}


def test_the_short_loops_points_average_point_by_point(tmp_path, cli):
    """``wake_short`` (a point per short loop) averages point by point, and `calibrate --average` saves it."""
    first, second = _profile(1.0), _profile(3.0)
    first.wake_short = {"2": [[0.4e-3, 1e-4], [1.0e-3, 3e-4]]}
    second.wake_short = {"2": [[0.6e-3, -1e-4], [1.2e-3, 5e-4]]}
    for profile in (first, second):
        profile.worker_server = {"2": [5e-4, 3e-4, 2e9]}
        profile.late_recv = {"2": 1e-3}
    averaged = average_profiles([first, second], ["a", "b"])
    assert averaged.wake_short["2"] == [pytest.approx([0.5e-3, 0.0]), pytest.approx([1.1e-3, 4e-4])]
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    first.save(paths[0])
    second.save(paths[1])
    result = cli("calibrate", "--average", ",".join(paths), "--out", str(tmp_path / "avg.json"))
    assert result.returncode == 0, result.stderr
    saved = HardwareProfile.load(str(tmp_path / "avg.json")).wake_short["2"]
    assert saved == [pytest.approx([0.5e-3, 0.0]), pytest.approx([1.1e-3, 4e-4])]
