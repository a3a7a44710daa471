"""``simpar calibrate`` then ``simpar validate`` on this machine, for real (2 ranks, short): every table of
the profile recorded, the cases judged, the calibration after the runs taken and averaged in."""

import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from simpar.calibrate import ranks_slowdown
from simpar.spread import spread_of


@pytest.mark.slow
def test_calibrate_then_validate_end_to_end(tmp_path, cli):
    profile = tmp_path / "hw.json"
    result = cli("calibrate", "--gpus", "2", "--repeats", "2", "--out", str(profile))
    assert result.returncode == 0, result.stderr
    data = json.loads(profile.read_text())
    assert set(data["ring"]) == set(data["wake"]) == set(data["resume"]) == {"2"}
    assert all(v >= 0 for v in (data["wake"]["2"], data["resume"]["2"], *data["ring"]["2"]))
    assert set(data["handoff"]) == {"2"} and data["handoff"]["2"] >= 0
    # 2 ranks computing at once: a rank's own pace beside the other over alone where they fit the cores
    shared = data["samples"]["shared"]["2"]
    burst = {"own_ratio": shared["burst_own_ratio"], "ratio": shared["burst_ratio"]}
    assert data["slowdown"]["2"] == pytest.approx(ranks_slowdown(burst, 2, os.cpu_count() or 1))
    assert shared["burst_own"] > 0 and shared["burst_own_ratio"] > 0 and shared["burst_ranks_own_ratio"] > 0
    assert all(row["timed_steps"] >= 2 for row in data["samples"]["compute"])
    assert data["machine"]["host_speed"] > 1e5  # the spinners' loop while it ran: iterations per CPU second
    assert set(data["send_issue"]) == {"2"} and data["send_issue"]["2"] > 0  # an isend takes some time
    assert set(data["late_recv"]) == {"2"} and data["late_recv"]["2"] >= 0
    # ... and by the ranks computing while it waits: at 2 ranks only its sender, late_worker's one pair
    assert data["late_recv_busy"] == {"2": {"1": data["late_recv"]["2"]}}
    assert set(data["samples"]["shared"]["2"]["late"]) == {"4096", "65536"}  # a late receive by message size
    # an isend's hold, its mean and spread read from every one timed (the simulator draws from the spread)
    assert data["send_issue"]["2"] == pytest.approx(statistics.fmean(shared["issued"]))
    assert data["send_issue_spread"]["2"] == pytest.approx(spread_of(shared["issued"]))
    assert {size: statistics.fmean(times) for size, times in shared["late_times"].items()} == \
        pytest.approx(shared["late"])  # every late receive kept, their mean by size as before
    assert set(data["resume_unit"]) == {"2"} and data["resume_unit"]["2"] > 0  # the unit's time alone
    # a short compute's resume (the unit's forward after a call and without), where the ranks fit the cores
    if (os.cpu_count() or 1) >= 2:
        after, base = shared["resume_forward"]
        assert data["resume_short"]["2"] == pytest.approx([base / data["slowdown"]["2"], max(after - base, 0.0)])
        assert 0 < base < data["resume_unit"]["2"]  # a forward: shorter than the unit's forward and backward
    assert len(data["samples"]["shared"]["2"]["pattern"]) == 24  # 4 ops x 3 sizes x (1 call, 4 in a row)
    assert set(data["worker_server"]) == {"2"} and all(v >= 0 for v in data["worker_server"]["2"])
    phases, extras = data["wake_curve"]["2"]  # the call after each length of compute: longer and longer
    assert len(phases) == len(extras) == 5 and phases == sorted(phases) and extras[0] == 0.0
    assert extras == sorted(extras) and not data["wake_growth"]
    ps_phases, ps_extras = data["worker_server_curve"]["2"]  # the Worker-Server all-reduce's own
    assert len(ps_phases) == 5 and ps_extras[0] == 0.0 and ps_extras == sorted(ps_extras)
    # the later calls' shift, measured where the ranks do not outnumber the cores
    assert set(data["series_late"]) == ({"2"} if (os.cpu_count() or 1) >= 2 else set())
    assert all(abs(shift) < 1.0 for shift in data["series_late"].values())
    assert set(data["series_level"]) == set(data["series_late"])  # ZeRO-3's gathers' level, where timed
    assert all(abs(level) < 1.0 for level in data["series_level"].values())
    assert set(data["series_last"]) == set(data["series_late"])  # ... and their last, before a compute
    assert all(abs(last) < 1.0 for last in data["series_last"].values())
    # the resume's tail: the step-like sequence's positions after the first, after a call against without one
    assert set(data["resume_tail"]) == set(data["series_late"])  # where the ranks fit the cores
    for world, fraction in data["resume_tail"].items():
        timed = data["samples"]["shared"][world]["tail"]
        assert len(timed["call"]) == len(timed["none"]) == 10  # tiny-deep's 8 layers, the backward, the step
        assert fraction == pytest.approx(max(sum(timed["call"][1:]) / sum(timed["none"][1:]) - 1, 0.0))
    # ... and their first, after the compute it followed (phase_worker's mid burst: shorter than the unit's)
    assert set(data["series_first"]) == set(data["series_late"])
    assert all(0 < compute < 1.0 and abs(extra) < 1.0 for compute, extra in data["series_first"].values())
    # the first call after a short compute (timed warm), beyond what the fitted ring prices that call at
    from simpar.calibrate import PHASE_SIZE
    from simpar.calibrate.fits import ring_price

    # after each of the short loops' computes (brief, short, mid), each longer than the one before
    timed = data["samples"]["shared"]["2"]["short_calls"]
    assert set(data["wake_short"]) == {"2"} and len(data["wake_short"]["2"]) == len(timed) == 3
    assert 0 < timed[0][0] < timed[1][0] < timed[2][0]
    assert data["short_size"] < PHASE_SIZE  # timed at a tensor-parallel activation's size, the bytes a trifle
    priced = ring_price("allreduce", data["short_size"], 2, *data["ring"]["2"])
    for (compute, call), (short, paid) in zip(timed, data["wake_short"]["2"]):
        assert short == compute and call > 0 and paid == pytest.approx(call - priced)
    # the executor's own series timed at the profile's precision (fp32: four bytes an element)
    gathers = data["samples"]["shared"]["2"]["series_calls"]
    assert gathers and all(call["bytes"] == 4 * call["elements"] for call in gathers)
    # ... after a forward and, in turn, after a backward: the layer's reduce-scatter, then the gathers after it,
    # each timed by place; the reduce-scatter's own level against its price, where the series was timed
    shared = data["samples"]["shared"]["2"]
    scatter, *after = shared["series_calls_bwd"]
    assert scatter["op"] == "reducescatter" and after and {call["op"] for call in after} == {"allgather"}
    assert len(shared["series_bwd"]) == len(shared["series_calls_bwd"]) and min(shared["series_bwd"]) > 0
    assert 0 < shared["series_compute"][0] < shared["series_compute"][1] < 1.0  # as long as a layer's forward, backward
    assert set(data["scatter_level"]) == set(data["series_late"])
    assert all(abs(level) < 1.0 for level in data["scatter_level"].values())
    # the phase loops' calls over their price, their later steps' (kept for every world calibrated)
    from simpar.calibrate.lag import later_steps

    assert set(data["later_steps"]) == set(data["ring"])
    for world, later in data["later_steps"].items():
        loops, extras = data["samples"]["shared"][world]["phases"], data["wake_curve"][world][1]
        loop_price = ring_price("allreduce", PHASE_SIZE, int(world), *data["ring"][world])
        assert later == pytest.approx(later_steps(loops["call_s"], extras, loop_price, data["wake"][world]))
        assert later >= 0
    # the executor's tensor-parallel pieces, timed on one rank: a piece's own cost beyond its share of the layer
    # ... and the vocabulary-parallel embedding's and head's, each whole
    assert set(data["tp_piece"]["fp32"]) == {"fwd", "bwd", "embedding_fwd", "head_fwd", "head_bwd", "embedding_bwd"}
    assert min(data["tp_piece"]["fp32"].values()) >= 0
    assert len(data["samples"]["tp_pieces"]) == len(data["samples"]["compute"]) // 3  # a row a model and batch
    assert min(data["sharded_work"]["fp32"]["gather"]) >= 0 < sum(data["sharded_work"]["fp32"]["gather"])
    assert min(data["sharded_work"]["fp32"]["scatter"]) >= 0 < sum(data["sharded_work"]["fp32"]["scatter"])
    assert min(data["sharded_work"]["fp32"]["accumulate"]) >= 0 < sum(data["sharded_work"]["fp32"]["accumulate"])
    from simpar.calibrate.cold import TAUS

    cold = data["unit_cold"]["fp32"]  # the once-a-step units' cold caches, fitted on gaps the steps timed
    assert cold["tau"] in TAUS and all(cold[phase][kind] >= 0 for phase in ("fwd", "bwd") for kind in cold[phase])
    assert result.stdout.count("cold caches: embedding") == 2  # printed for both phases
    assert result.stdout.count("a tensor-parallel piece of a layer: +") == 2
    # the gradients' concatenation inside the one-rank step op, timed apart: part of the step, fitted per
    # tensor and element, and printed
    assert all(0 < r["concat_s"] < r["step_s"] for r in data["samples"]["compute"])
    assert len(data["step_concat"]["fp32"]) == 2 and min(data["step_concat"]["fp32"]) >= 0
    assert "gradients concatenated first" in result.stdout
    # ... and right after the backward, as tp's and pp's step meets them
    assert all(r["cold_concat_s"] > 0 for r in data["samples"]["compute"])
    assert len(data["step_concat_cold"]["fp32"]) == 2 and min(data["step_concat_cold"]["fp32"]) >= 0
    assert "where no data-parallel call handled them" in result.stdout
    assert result.stdout.count("(the resume's tail)") == len(data["resume_tail"])
    assert result.stdout.count("(the loops over their price)") == len(data["later_steps"])
    # Adam split into tensors beside one tensor of as many parameters: what ZeRO-3's one shard per unit pays
    from simpar.calibrate import adam_per_tensor
    from simpar.calibrate.bench import ADAM_TENSORS

    split = [s for s in data["samples"]["host"]["steps"] if s.get("tensors")]
    assert [s["tensors"] for s in split] == [ADAM_TENSORS]
    assert data["optimizer_tensor"] == pytest.approx(adam_per_tensor(data["samples"]["host"]["steps"]))
    row = data["samples"]["compute"][0]
    assert len(row["fwd_gaps"]) == 1 and row["fwd_gaps"][0] > 0  # an embedding: one a step, a step apart
    for phase in ("fwd", "bwd"):  # overheads per unit kind (never negative) and a FLOP rate
        fit = data["compute"]["fp32"][phase]
        assert len(fit) == 4 and all(math.isfinite(v) and v >= 0 for v in fit) and fit[-1] > 0
    report = tmp_path / "report.md"
    # (a calibration after the runs, at its default repeats, takes longer than the cli fixture allows)
    result = subprocess.run([sys.executable, "-m", "simpar", "validate", "--strategies", "ddp,zero3", "--gpus", "2",
                             "--steps", "2", "--hardware", str(profile), "--repeats", "2", "--calibrate-after", "end",
                             "--out", str(report), "--json", "-"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["summary"]["cases"] == 2 and out["summary"]["bytes_exact"] and out["summary"]["memory_exact"]
    assert out["summary"]["max_abs_error"] == max(abs(c["error"]) for c in out["cases"])
    for case in out["cases"]:  # two real runs; the lower of the two is the median compared
        runs = case["real_runs_s"]
        assert len(runs) == 2 and case["real_step_s"] == min(runs)
        assert case["spread"] == pytest.approx((max(runs) - min(runs)) / min(runs))
        priced, measured = case["op_time_s"]["forward"]  # where the step went, priced and measured
        assert priced > 0 < measured and case["op_time_s"]["collectives"][1] > 0
        # each run read at the window's speed (host_speed.py): the median of the runs set at it
        at_speed = sorted(t * s for t, s in zip(runs, case["host_speeds"]))
        assert case["real_at_window_speed_s"] == pytest.approx(at_speed[0])
    assert out["summary"]["median_abs_speed_error"] >= 0
    # what the window's own noise lets it judge: both runs, and both profiles (the one before, fresh, and after)
    judged = out["summary"]["resolution"]["2"]
    assert (judged["runs"], judged["calibrations"], judged["cases"]) == (2, 2, 2) and judged["price_sd"] >= 0
    assert 0 <= judged["priced_chance"] <= 1 and "What this window's own noise" in report.read_text()
    assert "| zero3 | 2 |" in report.read_text() and "At the window's speed" in report.read_text()
    after = report.with_suffix(".after.json")  # calibrated again once the runs were done, and averaged
    assert out["calibrated_after"] == [str(after)] and set(json.loads(after.read_text())["ring"]) == {"2"}
    assert report.with_suffix(".csv").exists() and report.with_suffix(".png").stat().st_size > 0
