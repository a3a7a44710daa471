"""``simpar run --compare-real``: the measured run in the simulator's schema, with relative errors."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_compare_real_json_puts_the_measured_run_beside_the_simulated_one(cli):
    out = json.loads(cli("run", "--strategy", "zero2", "--gpus", "2", "--steps", "2", "--compare-real",
                         "--json", "-").stdout)
    sim, real, comparison = out["sim"], out["real"], out["comparison"]
    assert out["scenario"]["model"] == "tiny" and out["scenario"]["train"]["precision"] == "fp32"
    assert "rough built-in CPU-host profile" in out["profile"]
    assert set(sim) <= set(real)  # the same schema, plus what only a real run has (steps, losses)
    assert [set(r) for r in sim["ranks"]] == [set(r) - {"step_times_s"} for r in real["ranks"]]
    assert len(real["ranks"]) == 2 and real["step_time_s"] > 0
    for key in ("bytes_sent", "bytes_received"):
        assert comparison[key]["ranks_equal"] == 2 and comparison[key]["error"] == 0
    for category in ("params", "grads", "optimizer"):
        assert comparison["memory"][category]["error"] == 0
    row = comparison["step_time_s"]
    assert row["error"] == pytest.approx((row["sim"] - row["real"]) / row["real"])


def test_compare_real_table_and_errors(cli):
    table = cli("run", "--strategy", "ddp", "--gpus", "2", "--steps", "1", "--compare-real").stdout
    assert "simulated on a CPU-host profile vs measured with gloo" in table
    assert "equal on 2/2 ranks" in table and "step time" in table and "optimizer" in table
    for args, message in [(("--topology", "pcie"), "--topology: --compare-real simulates the machine"),
                          (("--backend", "mpi"), "--backend: must be one of gloo, nccl"),
                          (("--steps", "0"), "--steps"),
                          (("--strategy", "zero3-infinity"), "--compare-real: the executor performs")]:
        result = cli("run", "--gpus", "2", "--compare-real", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
