"""``simpar calibrate`` then ``simpar validate`` on this machine, for real (2 ranks, short): every term of the
profile measured at the world asked for, the cases judged, saved, and priced again the same from the file."""

import json
import math
import subprocess
import sys

import pytest

from simpar.calibrate.fits import ring_price
from simpar.calibrate.profile import PHASE_SIZE, HardwareProfile
from simpar.validate import load_runs, reprice

PER_WORLD = ("ring", "wake", "wake_phase", "wake_curve", "wake_short", "later_steps", "resume", "resume_after_recv",
             "handoff", "late_recv", "worker_server")


@pytest.mark.slow
def test_calibrate_then_validate_end_to_end(tmp_path, cli):
    path = tmp_path / "hw.json"
    # quick (docs' test runs the full one): every term is measured either way, in fewer rounds
    result = cli("calibrate", "--gpus", "2", "--quick", "--out", str(path))
    assert result.returncode == 0, result.stderr
    data = json.loads(path.read_text())
    for term in PER_WORLD:
        assert set(data[term]) == {"2"}, term
    assert all(v >= 0 for v in (data["wake"]["2"], data["resume"]["2"], data["handoff"]["2"], *data["ring"]["2"]))
    phases, extras = data["wake_curve"]["2"]  # the call after each length of compute: longer and longer
    assert len(phases) == len(extras) == 5 and phases == sorted(phases) and extras[0] == 0.0
    assert phases[0] == data["wake_phase"]["2"]
    timed = data["samples"]["shared"]["2"]["short_calls"]  # the calls after short computes, beyond their price
    priced = ring_price("allreduce", 2**14, 2, *data["ring"]["2"])
    for (compute, call), (short, paid) in zip(timed, data["wake_short"]["2"]):
        assert short == compute and paid == pytest.approx(call - priced)
    # (a kind whose fit comes out at or below zero is noise, left out: accumulate's is a difference of timings)
    assert {"", "gather", "scatter"} <= set(data["handling"]["fp32"]) <= {"", "gather", "scatter", "accumulate"}
    assert all(v >= 0 for kind in data["handling"]["fp32"].values() for v in kind)
    for phase in ("fwd", "bwd"):  # overheads per unit kind (never negative) and a FLOP rate
        fit = data["compute"]["fp32"][phase]
        assert len(fit) == 4 and all(math.isfinite(v) and v >= 0 for v in fit) and fit[-1] > 0
    step_s, params_per_s = data["optimizer_step"]["fp32"]
    assert step_s >= 0 < params_per_s and min(data["attention_scores"]["fp32"]) >= 0
    assert PHASE_SIZE > 2**14 and "Worker-Server leg" in result.stdout

    report, saved = tmp_path / "report.md", tmp_path / "runs.json"
    result = subprocess.run([sys.executable, "-m", "simpar", "validate", "--strategies", "ddp,zero3", "--gpus", "2",
                             "--steps", "3", "--seconds", "0", "--hardware", str(path), "--repeats", "2",
                             "--calibrate-after", "none", "--save", str(saved), "--out", str(report),
                             "--json", "-"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["summary"]["cases"] == 2 and out["summary"]["bytes_exact"] and out["summary"]["memory_exact"]
    assert out["summary"]["max_abs_error"] == max(abs(c["error"]) for c in out["cases"])
    for case in out["cases"]:  # two real runs; the lower of the two is the one compared
        runs = case["real_runs_s"]
        assert len(runs) == 2 and case["real_step_s"] == min(runs)
        assert case["spread"] == pytest.approx((max(runs) - min(runs)) / min(runs))
        priced, measured = case["op_time_s"]["forward"]  # where the step went, priced and measured
        assert priced > 0 < measured and case["op_time_s"]["collectives"][1] > 0
    again = reprice(load_runs(str(saved)), HardwareProfile.load(str(path)))
    assert [c["error"] for c in again] == pytest.approx([c["error"] for c in out["cases"]], rel=1e-9)
    assert "| zero3 | 2 |" in report.read_text() and report.with_suffix(".png").stat().st_size > 0
