import json

import pytest


def test_collective_json_has_the_documented_fields(cli):
    out = cli("collective", "--op", "allreduce", "--algo", "ring", "--gpus", "16", "--bytes", "1e9",
              "--topology", "ring", "--bandwidth", "100e9", "--latency", "5e-6", "--json", "-")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["time_s"] == pytest.approx(2 * 15 * 5e-6 + 2 * 15 / 16 * 1e9 / 100e9)
    assert data["algbw_Bps"] == pytest.approx(1e9 / data["time_s"])
    assert data["busbw_Bps"] == pytest.approx(data["algbw_Bps"] * 2 * 15 / 16)
    assert [r["rank"] for r in data["ranks"]] == list(range(16))
    assert all(r["bytes_sent"] == r["bytes_received"] == 1875000000 for r in data["ranks"])
    assert {link["name"] for link in data["links"]} == {f"gpu{i}->gpu{(i + 1) % 16}" for i in range(16)}
    assert "server" not in data


def test_worker_server_json_reports_the_server(cli, tmp_path):
    path = tmp_path / "ws.json"
    out = cli("collective", "--algo", "ps", "--gpus", "4", "--topology", "star", "--bytes", "1GB",
              "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "Server: sent 4,000,000,000 B" in out.stdout  # the table is printed too
    assert json.loads(path.read_text())["server"] == {"bytes_sent": 4 * 10**9, "bytes_received": 4 * 10**9}


def test_sweep_prints_a_row_per_power_of_two(cli):
    out = cli("collective", "--gpus", "8", "--topology", "dgx-h100", "--sweep", "--min-bytes", "1KiB",
              "--bytes", "1MiB")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert len(rows) == 11 and rows[-1].split()[0] == "1,048,576"
    data = json.loads(cli("collective", "--gpus", "8", "--sweep", "--bytes", "4KiB", "--json", "-").stdout)
    assert [row["bytes"] for row in data["sweep"]] == [1024, 2048, 4096]


def test_every_topology_preset_works_from_the_cli(cli):
    listing = json.loads(cli("topologies", "--json", "-").stdout)
    for preset in listing:
        out = cli("collective", "--topology", preset["name"], "--gpus", "4", "--bytes", "1MiB", "--json", "-")
        assert out.returncode == 0, (preset["name"], out.stderr)
        assert json.loads(out.stdout)["time_s"] > 0


def test_devices_lists_the_presets(cli):
    out = cli("devices")
    assert out.returncode == 0
    for name in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "rtx-3090", "rtx-4090"):
        assert name in out.stdout
    data = json.loads(cli("devices", "--json", "-").stdout)
    assert {"gpu", "host", "nvme"} <= set(data)


@pytest.mark.parametrize("args, field", [
    (["--op", "gossip"], "--op"),
    (["--op", "alltoall", "--algo", "ring"], "--algo"),
    (["--algo", "magic"], "--algo"),
    (["--topology", "torus"], "--topology"),
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "-3"], "--gpus"),
    (["--gpus", "abc"], "--gpus"),
    (["--gpus", "1"], "--gpus"),
    (["--gpus", "12", "--topology", "dgx-a100"], "--gpus"),
    (["--gpus", "9", "--topology", "workstation"], "--gpus"),
    (["--bytes", "0"], "--bytes"),
    (["--bytes", "-5"], "--bytes"),
    (["--bytes", "12x"], "--bytes"),
    (["--bytes", "0.5"], "--bytes"),
    (["--bandwidth", "0"], "--bandwidth"),
    (["--bandwidth", "fast"], "--bandwidth"),
    (["--latency", "-1e-6"], "--latency"),
    (["--latency", "1e-6", "--topology", "dgx-a100"], "--latency"),
    (["--op", "p2p", "--peer", "99"], "--peer"),
    (["--frobnicate"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_naming_the_problem_and_exit_2(cli, args, field):
    out = cli("collective", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and lines[0].startswith("simpar: error:")
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_no_command_prints_help_and_fails(cli):
    out = cli()
    assert out.returncode == 2 and "collective" in out.stderr


def test_version_prints_the_package_version(cli):
    from simpar import __version__

    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"simpar {__version__}"
