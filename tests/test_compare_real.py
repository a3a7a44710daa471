"""``simpar run --compare-real``: the measured run in the simulator's schema, with relative errors."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rank_processes import left_after, ranks_of, started_by
from simpar.real.launch import free_port

pytestmark = pytest.mark.slow


def test_compare_real_json_puts_the_measured_run_beside_the_simulated_one(cli):
    out = json.loads(cli("run", "--strategy", "zero2", "--gpus", "2", "--steps", "6", "--compare-real",
                         "--op-timeline", "--json", "-").stdout)
    sim, real, comparison = out["sim"], out["real"], out["comparison"]
    assert out["scenario"]["model"] == "tiny-deep" and out["scenario"]["train"]["precision"] == "fp32"
    assert "(a quick calibration: micro-benchmarks of this machine)" in out["profile"]  # measured on the first run
    assert set(sim) <= set(real)  # the same schema, plus what only a real run has (steps, losses)
    assert [set(r) for r in sim["ranks"]] == [set(r) - {"step_times_s", "op_mean_s"} for r in real["ranks"]]
    simulated_ops = [(o["op"], o["class"]) for o in sim["op_timeline"][0]["ops"]]
    assert [[(o["op"], o["class"]) for o in t["ops"]] for t in real["op_timeline"]] == [simulated_ops] * 2
    assert len(real["ranks"]) == 2 and real["step_time_s"] > 0
    for key in ("bytes_sent", "bytes_received"):
        assert comparison[key]["ranks_equal"] == 2 and comparison[key]["error"] == 0
    for category in ("params", "grads", "optimizer"):
        assert comparison["memory"][category]["error"] == 0
    row = comparison["step_time_s"]
    assert row["error"] == pytest.approx((row["sim"] - row["real"]) / row["real"])
    # the executor's work between ops, in no op measured: the step less each rank's op classes
    gaps = [real["step_time_s"] - sum(r["op_time"].values()) for r in real["ranks"]]
    assert comparison["outside_ops_s"]["real"] == pytest.approx(sum(gaps) / 2) and min(gaps) > 0


def test_compare_real_table_and_errors(cli):
    table = cli("run", "--strategy", "ddp", "--gpus", "2", "--steps", "1", "--compare-real").stdout
    assert "simulated on a profile of this machine vs measured with gloo" in table
    assert "equal on 2/2 ranks" in table and "step time" in table and "optimizer" in table
    assert "in no op" in table and "the executor's work between ops" in table
    for args, message in [(("--topology", "pcie"), "--topology: --compare-real simulates the machine"),
                          (("--backend", "mpi"), "--backend: must be one of gloo, nccl"),
                          (("--steps", "0"), "--steps"),
                          (("--algo", "tree"), "--algo: the executor performs ring and ps"),
                          (("--precision", "fp16-mixed"), "--precision: fp16 needs loss scaling")]:
        result = cli("run", "--gpus", "2", "--compare-real", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("whole_group", [True, False])
def test_ctrl_c_stops_the_run_and_leaves_no_rank_behind(whole_group):
    """Ctrl-C in a terminal interrupts the whole foreground process group (simpar and its ranks);
    a SIGINT to simpar alone must still take its ranks down."""
    command = [sys.executable, "-m", "simpar", "run", "--strategy", "ddp", "--gpus", "4", "--steps", "1000",
               "--compare-real"]
    # as from a terminal: a suite started in the background (``cmd &`` in a script) ignores SIGINT, and its
    # children would inherit that, as Unix programs should
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    ranks: set[int] = set()
    while len(ranks) < 4 and time.monotonic() < deadline:  # wait until the ranks are up
        ranks = ranks_of(proc.pid)
        time.sleep(0.5)
    assert len(ranks) == 4
    time.sleep(3)  # into the training steps
    ranks = started_by(proc.pid)  # the fork server they came from too
    if whole_group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in stderr
    assert left_after(ranks) == []


def test_the_same_worker_runs_under_torchrun(tmp_path):
    port = str(free_port())
    done = subprocess.run(["torchrun", "--nproc-per-node", "2", "--master-port", port, "-m", "simpar.real.torchrun",
                           "--strategy", "zero1", "--gpus", "2", "--steps", "2", "--json", str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["comparison"]["bytes_sent"]["ranks_equal"] == 2
    assert result["comparison"]["memory"]["optimizer"]["error"] == 0



@pytest.mark.parametrize("args", [("--model", "tiny", "--gpus", "2", "--cp", "2", "--cp-algo", "ulysses"),
                                  ("--model", "tiny-deep", "--gpus", "2", "--pp", "2", "--schedule", "zb-h1",
                                   "--microbatches", "4")])
def test_compare_real_runs_every_rank_of_long_context_and_zero_bubble_layouts(cli, args):
    """The ranks launched are dp x cp x pp x tp: a context-parallel run has cp times its data-parallel ranks."""
    out = json.loads(cli("run", "--strategy", "3d", "--steps", "2", "--compare-real",
                         *args, "--json", "-").stdout)
    assert len(out["real"]["ranks"]) == 2
    for key in ("bytes_sent", "bytes_received"):
        assert out["comparison"][key]["ranks_equal"] == 2 and out["comparison"][key]["error"] == 0
