"""``simpar run`` as a user meets it: defaults, JSON schema, and one-line errors with exit code 2."""

import json

import pytest


def test_bare_run_works_on_defaults(cli):
    result = cli("run")
    assert result.returncode == 0, result.stderr
    assert "step time" in result.stdout and "compute" in result.stdout


def test_run_json_schema(cli):
    result = cli("run", "--strategy", "zero2", "--gpus", "16", "--model", "gpt2", "--json", "-")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    sim = data["sim"]
    assert sim["step_time_s"] > 0
    assert set(sim["breakdown"]) == {"compute", "communication", "bubble", "offload", "idle"}
    assert sum(sim["breakdown"].values()) == pytest.approx(sim["step_time_s"])
    assert [r["rank"] for r in sim["ranks"]] == list(range(16))
    for rank in sim["ranks"]:
        assert {"bytes_sent", "bytes_received"} <= set(rank)
        assert {"params", "grads", "optimizer", "activations", "peak"} <= set(rank["memory"])
        assert rank["memory"]["peak"] >= rank["memory"]["params"] + rank["memory"]["optimizer"]
    assert data["scenario"]["strategy"]["dp"] == 16


def test_run_json_to_file(cli, tmp_path):
    path = tmp_path / "out.json"
    result = cli("run", "--strategy", "pp", "--gpus", "4", "--json", str(path))
    assert result.returncode == 0, result.stderr
    assert "step time" in result.stdout
    assert json.loads(path.read_text())["sim"]["breakdown"]["bubble"] > 0


@pytest.mark.parametrize("args,flag", [
    (("--strategy", "3d", "--gpus", "16", "--pp", "3"), "--gpus"),
    (("--strategy", "pp", "--gpus", "5", "--model", "gpt2"), "--pp"),
    (("--strategy", "tp", "--gpus", "8", "--model", "gpt2"), "--tp"),  # 12 heads
    (("--strategy", "ddp", "--gpus", "8", "--global-batch", "12"), "--global-batch"),
    (("--strategy", "zero9",), "--strategy"),
    (("--model", "gpt5",), "--model"),
    (("--topology", "moon",), "--topology"),
    (("--strategy", "ddp", "--tp", "2"), "--tp"),
    (("--strategy", "pp", "--gpus", "4", "--schedule", "zigzag"), "--schedule"),
    (("--strategy", "pp", "--gpus", "4", "--schedule", "interleaved", "--microbatches", "6"), "--microbatches"),
    (("--strategy", "zero3", "--algo", "tree"), "--algo"),
    (("--strategy", "zero2-offload", "--topology", "ring"), "--topology"),
    (("--gpus", "two"), "--gpus"),
    (("--micro-batch", "0"), "--micro-batch"),
])
def test_invalid_input_is_one_line_exit_2(cli, args, flag):
    result = cli("run", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simpar: error: ") and flag in lines[0], result.stderr


def test_oom_names_rank_category_excess_and_what_fits(cli):
    result = cli("run", "--strategy", "ddp", "--gpus", "8", "--model", "llama2-7b", "--flash-attention")
    assert result.returncode == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "out of memory: rank 0" in message and "over" in message
    assert "largest category optimizer" in message  # 12 x 6.7e9 bytes of Adam states on each GPU
    assert "Strategies that fit:" in message and "zero3" in message


def test_memory_command_json(cli):
    result = cli("memory", "--params", "7.5e9", "--strategy", "zero1", "--gpus", "64", "--json", "-")
    assert result.returncode == 0, result.stderr
    per_gpu = json.loads(result.stdout)["per_gpu"]
    assert per_gpu["params"] + per_gpu["grads"] + per_gpu["optimizer"] == 4 * 7.5e9 + 12 * 7.5e9 / 64


def test_memory_timeline_reaches_the_reported_peak(cli):
    result = cli("run", "--strategy", "zero3", "--gpus", "4", "--model", "small", "--memory-timeline", "--json", "-")
    assert result.returncode == 0, result.stderr
    sim = json.loads(result.stdout)["sim"]
    (program,) = sim["memory_timeline"]
    times = [t for t, _ in program["points"]]
    assert times == sorted(times) and times[-1] <= sim["step_time_s"]
    assert max(b for _, b in program["points"]) == sim["ranks"][0]["memory"]["peak"]
    assert program["points"][-1][1] == sum(sim["ranks"][0]["memory"][c] for c in ("params", "grads", "optimizer"))
