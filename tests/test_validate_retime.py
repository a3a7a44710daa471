"""``simpar validate`` re-times the units' compute after each round of runs (the calibration's own
one-rank benchmark) and prices the cases with those passes' fit; everything else stays calibrated."""

import pytest

import simpar.calibrate as calibrate
import simpar.validate as validate
from simpar.calibrate.profile import HardwareProfile
from simpar.calibrate.fits import fit_unit_costs


def _profile() -> HardwareProfile:
    return HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9],
                                             "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                           slowdown={"1": 1.0, "2": 1.1}, ring={"2": [50e-6, 2e9]},
                           optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10,
                           resume={"2": 3e-4}, between_ops=10e-6)


def _pass(scale: float) -> list[dict]:
    """compute_worker's rows for a machine ``scale`` times slower than 10 us + flops / 10 GFLOP/s."""
    return [{"model": "tiny", "batch": b, "unit": kind, "fwd_flops": f * b, "bwd_flops": 2 * f * b,
             "fwd_s": scale * (10e-6 + f * b / 1e10), "bwd_s": scale * (20e-6 + 2 * f * b / 1e10),
             "between_ops_s": scale * 30e-6}
            for kind, f in (("embedding", 1e5), ("layer", 4e6), ("head", 2e6)) for b in (1, 2, 4)]


def test_retimed_fits_the_passes_and_keeps_the_rest():
    profile = _profile()
    passes = [_pass(1.0), _pass(1.5)]
    fresh = calibrate.retimed(profile, passes, "fp32")
    averaged = calibrate.average_passes(passes)
    for phase in ("fwd", "bwd"):
        extras = ("table", "scores") if phase == "bwd" else ("scores",)
        assert fresh.compute["fp32"][phase] == pytest.approx(fit_unit_costs(averaged, phase, extras)[0])
    assert fresh.compute["fp32"]["fwd"][-1] == pytest.approx(1e10 / 1.25)  # the passes' mean speed
    assert fresh.between_ops == pytest.approx(1.25 * 30e-6)
    assert (fresh.ring, fresh.slowdown, fresh.resume) == (profile.ring, profile.slowdown, profile.resume)
    assert profile.compute["fp32"]["fwd"][-1] == 50e9 and profile.between_ops == 10e-6  # not changed


def test_run_cases_times_a_pass_after_each_round_and_prices_with_it(monkeypatch):
    events, priced = [], []
    monkeypatch.setattr(validate, "measure", lambda *case: events.append(("run", case[:2])) or {"step_time_s": 1.0})
    monkeypatch.setattr(calibrate, "compute_pass",
                        lambda precision, timeout: events.append(("pass",)) or _pass(1.0 + len(events) / 10))
    monkeypatch.setattr(validate, "judge", lambda profile, *case: priced.append(profile) or case[:2])
    pairs = [("ddp", 2), ("tp", 2)]
    profile = _profile()
    validate.run_cases(profile, pairs, "fp32", 3, 60.0, repeats=2, retime=True)
    assert events == [("run", p) for p in pairs] + [("pass",)] + [("run", p) for p in pairs] + [("pass",)]
    assert all(p is priced[0] for p in priced) and priced[0] is not profile
    assert priced[0].compute["fp32"]["fwd"][-1] == pytest.approx(1e10 / 1.45)  # mean of the 1.3x and 1.6x passes
    events.clear(), priced.clear()
    validate.run_cases(profile, pairs, "fp32", 3, 60.0, repeats=1)  # not asked: the profile as calibrated
    assert ("pass",) not in events and priced == [profile, profile]


def test_validate_rejects_an_unknown_compute_choice(cli):
    result = cli("validate", "--compute", "guess")
    assert result.returncode != 0 and "--compute" in result.stderr and "Traceback" not in result.stderr


def test_the_report_says_when_the_compute_was_retimed(tmp_path):
    case = {"strategy": "ddp", "gpus": 2, "sim_step_s": 0.03, "real_step_s": 0.033, "error": -0.09, "spread": 0.2,
            "bytes_exact": True, "memory_exact": True, "real_runs_s": [0.03, 0.033, 0.036]}
    result = validate.summary([case])
    for retimed in (False, True):
        report = tmp_path / f"r{retimed}.md"
        validate.write_report(report, "hw.json", [case], result, retimed=retimed)
        assert ("re-timed after each round" in report.read_text()) == retimed
