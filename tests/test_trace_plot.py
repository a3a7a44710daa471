"""--trace (Chrome trace events), --plot and `simpar plot`: what they draw is what was simulated."""

import json
from collections import Counter, defaultdict

import pytest

from simpar import topologies
from simpar.cli import main
from simpar.models import model
from simpar.plan import STREAMS, op_class
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.strategies import build_plan
from simpar.trace import LINKS_PID, REAL_PID, build_trace


@pytest.fixture(scope="module")
def pipeline():
    scenario = make_scenario(model("gpt2"), "pp", 4, topology="dgx-a100", microbatches=8)
    result = simulate(scenario, record_links=True)
    return scenario, result, build_trace(build_plan(scenario), result.to_json(ops=True, links=True))


def test_one_process_per_rank_one_thread_per_stream(pipeline):
    scenario, result, trace = pipeline
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert [names[r] for r in range(4)] == [f"sim rank {r} (stage {r})" for r in range(4)]
    assert names[LINKS_PID].startswith("sim links")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert threads[(0, 0)] == "compute" and threads[(2, STREAMS.index("recv"))] == "recv"


def test_every_timed_op_is_one_slice_with_the_simulated_times(pipeline):
    scenario, result, trace = pipeline
    plan = build_plan(scenario)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    per_rank = Counter(e["pid"] for e in slices)
    for rank in range(4):
        timed = [op for op in plan.program_of(rank).ops if op_class(op)]
        assert per_rank[rank] == len(timed)
    end = max((e["ts"] + e["dur"]) for e in slices)
    assert end == pytest.approx(1e6 * result.step_time_s, rel=1e-9)
    assert all(e["dur"] >= 0 for e in slices)


def test_link_counters_add_up_to_the_bytes_each_link_carried(pipeline):
    """Integrating utilisation x capacity over time gives back each link's bytes, exactly."""
    scenario, result, trace = pipeline
    topology = topologies.build("dgx-a100", 4, None, None)
    capacity = {topology.channel_name(c): topology.capacities[c] for c in range(topology.num_channels)}
    points = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "C":
            points[e["name"].split(" (")[0]].append((e["ts"] / 1e6, e["args"]["utilisation"]))
    carried = {link["name"]: link["bytes"] for link in result.links}
    assert set(points) == set(carried)
    for name, series in points.items():
        assert all(0 <= u <= 1 for _, u in series)
        moved = sum((t1 - t0) * u * capacity[name] for (t0, u), (t1, _) in zip(series, series[1:]))
        assert moved == pytest.approx(carried[name], rel=1e-3)


def test_run_writes_trace_and_plot_and_plot_command_redraws(tmp_path, capsys):
    trace, image, saved = tmp_path / "t.json", tmp_path / "run.png", tmp_path / "run.json"
    assert main(["run", "--strategy", "zero3", "--gpus", "8", "--trace", str(trace), "--plot", str(image)]) == 0
    printed = capsys.readouterr().out
    assert f"trace: {trace}" in printed and f"figure: {image}" in printed
    assert json.loads(trace.read_text())["traceEvents"]
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["run", "--strategy", "pp", "--gpus", "4", "--op-timeline", "--memory-timeline",
                 "--json", str(saved)]) == 0
    capsys.readouterr()
    redrawn = tmp_path / "again.svg"
    assert main(["plot", str(saved), "--out", str(redrawn), "--panels", "timeline,memory-time"]) == 0
    assert redrawn.read_text().lstrip().startswith("<?xml")


def test_plot_errors_name_what_is_missing(tmp_path, capsys):
    saved = tmp_path / "plain.json"
    assert main(["run", "--gpus", "2", "--json", str(saved)]) == 0
    assert main(["plot", str(saved), "--panels", "timeline"]) == 2
    assert "timeline (needs --op-timeline)" in capsys.readouterr().err
    assert main(["plot", str(saved), "--panels", "nonsense"]) == 2
    assert "--panels: unknown nonsense" in capsys.readouterr().err
    (tmp_path / "other.json").write_text("{\"a\": 1}")
    assert main(["plot", str(tmp_path / "other.json")]) == 2
    assert "not 'simpar run --json' output" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_real_trace_has_real_ranks_beside_simulated(tmp_path, capsys):
    trace = tmp_path / "both.json"
    image = tmp_path / "both.png"
    assert main(["run", "--compare-real", "--strategy", "zero2", "--gpus", "2", "--model", "tiny", "--steps", "2",
                 "--trace", str(trace), "--plot", str(image)]) == 0
    capsys.readouterr()
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names[0].startswith("sim rank 0") and names[REAL_PID + 1].startswith("real rank 1")
    sim_slices = sum(e["ph"] == "X" and e["pid"] < REAL_PID for e in events)
    real_slices = sum(e["ph"] == "X" and REAL_PID <= e["pid"] < LINKS_PID for e in events)
    assert sim_slices == real_slices > 0  # the same ops, simulated and measured
    assert image.stat().st_size > 0


def test_plot_help_names_every_panel():
    from simpar.cli.plot import HELP_PANELS
    from simpar.plots import PANELS

    assert HELP_PANELS == ", ".join(PANELS)
