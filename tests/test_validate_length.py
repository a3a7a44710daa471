"""``simpar validate`` makes each real run last a given time (``--seconds``) at the step time the profile
prices: this machine's speed flips between states lasting seconds, and a run of a fraction of a second
draws one of them. The price only sets the number of steps."""

import math

import simpar.validate as validate
from simpar.calibrate.profile import HardwareProfile


def _profile() -> HardwareProfile:
    return HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                           ring={"2": [50e-6, 2e9]}, optimizer_params_per_s={"adam": 1e8, "sgd": 4e8},
                           copy_bytes_per_s=1e10, resume={"2": 3e-4})


def test_a_run_takes_the_steps_that_last_the_seconds_asked_at_the_priced_step_time():
    profile = _profile()
    predicted = validate.simulate(validate.case_scenario("ddp", 2, "fp32"), topology=profile.topology(2, "fp32"),
                                  serial=True).step_time_s
    steps = validate.run_steps(profile, "ddp", 2, "fp32", 6, 4.0)
    assert steps == max(6, 1 + math.ceil(4.0 / predicted))  # the warm-up step on top
    assert (steps - 2) * predicted < 4.0 <= (steps - 1) * predicted or steps == 6
    assert validate.run_steps(profile, "ddp", 2, "fp32", 6, 0.0) == 6  # 0: --steps exactly
    assert validate.run_steps(None, "ddp", 2, "fp32", 6, 4.0) == 6  # nothing to price with
    assert validate.run_steps(profile, "ddp", 2, "fp32", 6, 1e-9) == 6  # never fewer than asked
    assert validate.run_steps(profile, "ddp", 2, "fp32", 6, 1e6) == validate.MAX_STEPS


def test_run_cases_runs_each_case_for_its_own_length_every_round(monkeypatch):
    asked = []
    monkeypatch.setattr(validate, "measure", lambda strategy, gpus, precision, steps, timeout:
                        asked.append((strategy, gpus, steps)) or {"step_time_s": 1.0})
    monkeypatch.setattr(validate, "run_steps", lambda profile, strategy, gpus, precision, steps, seconds:
                        steps + (10 if strategy == "pp" else 20) * int(seconds))
    monkeypatch.setattr(validate, "judge", lambda profile, *case: case[:2])
    validate.run_cases(None, [("pp", 2), ("ddp", 4)], "fp32", 6, 60.0, repeats=2, seconds=2.0)
    assert asked == [("pp", 2, 26), ("ddp", 4, 46)] * 2


def test_validate_rejects_negative_seconds(cli):
    result = cli("validate", "--seconds", "-1")
    assert result.returncode != 0 and "--seconds" in result.stderr and "Traceback" not in result.stderr
