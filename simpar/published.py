"""``simpar validate --published``: the simulator against published measurements of real runs.

Each case of validation/published.json names its source, hardware preset (or a cluster file of the
source tree), model shape (an MoE's experts too), layout (``ep`` for expert parallelism; a ``strategy``
other than 3d and further strategy ``options`` such as ZeRO++'s) and batch, the quantity measured and its
value; this module simulates it and reports simulated beside measured with the relative error
(simulated - measured) / measured. Sets A-D are the referee (their mean and max |error| are the summary,
and each group's: A-C on A100, D on H100); a set outside them (set E: FP8 runs from NeMo's performance
tables, whose overlaps come from recipes the tables do not state; a user's own file may hold any) is
reported apart. A case simpar cannot express (an unknown preset, an impossible layout) is skipped with
the reason, never dropped.

Long pipelines are simulated at p and 2p micro-batches and extrapolated (a step is affine in the
number of micro-batches once the pipeline is full; simpar.search does the same and its tests hold
it to the full simulation), with collectives replayed after their first run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from simpar import topologies
from simpar.collective_run import simulate_collective
from simpar.errors import SimparError
from simpar.flops import model_flops
from simpar.models import ModelSpec
from simpar.plan import Compute
from simpar.scenario import make_scenario
from simpar.sim.extrapolate import extrapolate, extrapolation_points
from simpar.sim import fast
from simpar.sim.runner import Simulator
from simpar.strategies import build_plan
from simpar.topologies.cluster_file import is_cluster_file

DEFAULT_FILE = Path(__file__).resolve().parents[1] / "validation" / "published.json"
REFEREE_SETS = ("A", "B", "C", "D")
# the referee's groups, each reported on its own line too: A100 runs and collectives, Megatron-Core on H100
GROUPS = {"A-C": ("A", "B", "C"), "D": ("D",)}
QUANTITIES = ("tflops_per_gpu", "tokens_per_gpu_s", "layer_forward_ms", "layer_backward_ms", "busbw_GBps")


def load(path: str | Path | None = None) -> list[dict]:
    path = Path(path) if path else DEFAULT_FILE
    if not path.exists():
        raise SimparError(f"--published: no file {str(path)!r} (the published suite ships in the source tree's "
                          "validation/ folder; give its path)")
    try:
        cases = json.loads(path.read_text())["cases"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise SimparError(f"--published: {path} is not a published-measurement file ({exc})") from None
    return cases


def _hardware(case: dict) -> str:
    """The case's preset, or its cluster file (a relative path is the source tree's: examples/clusters/...)."""
    name = case["hardware"]
    if is_cluster_file(name) and not Path(name).is_absolute():
        return str(DEFAULT_FILE.parents[1] / name)
    return name


def _scenario(case: dict, microbatches: int | None = None):
    lay = case["layout"]
    model = ModelSpec(**case["model"])  # the entry's keys are ModelSpec's fields
    cp = lay.get("cp", 1)  # context parallelism: each sequence over cp ranks (cp_algo in "options")
    dp = lay["gpus"] // (lay["tp"] * lay["pp"] * cp)
    batch = case["batch"] if microbatches is None else case["micro_batch"] * dp * microbatches
    strategy = case.get("strategy", "3d")  # data-parallel ones (zero3 with ZeRO++, hsdp...) take dp alone
    degrees = {"tp": lay["tp"], "pp": lay["pp"], "dp": dp} if strategy in ("3d", "pp", "tp") else {}
    return make_scenario(model, strategy, lay["gpus"], topology=_hardware(case), micro_batch=case["micro_batch"],
                         global_batch=batch, precision=case.get("precision", "bf16-mixed"), **degrees,
                         recompute=case.get("recompute", "none"), ep=lay.get("ep", 1), cp=cp,
                         **case.get("options", {}),  # further StrategySpec fields: expert_imbalance, zeropp_*...
                         schedule=lay.get("schedule", "1f1b"), virtual_stages=lay.get("virtual_stages", 1),
                         sequence_parallel=lay.get("sequence_parallel", False),
                         tp_comm_overlap=lay.get("tp_comm_overlap", False),
                         overlap_grad_reduce=lay.get("overlap_grad_reduce", False),
                         overlap_param_gather=lay.get("overlap_param_gather", False),
                         tp_comm_userbuffers=lay.get("tp_comm_userbuffers", False),
                         flash_attention=case.get("flash_attention", False),
                         grad_accum_dtype=case.get("grad_accum_dtype"))


def _run(scenario, replay=True) -> Simulator:
    topology = topologies.build(scenario.cluster.topology, scenario.cluster.gpus)
    sim = Simulator(build_plan(scenario), scenario, topology, replay=replay)
    sim.run()
    return sim


def step_time(case: dict, exact: bool = False) -> float:
    """The step at the case's micro-batch count, extrapolated from the pipeline's period; each point
    on the fast path (sim/fast.py), or with ``exact`` the full simulation (contention between
    overlapping transfers included)."""
    scenario = _scenario(case)
    p, m = scenario.strategy.pp, scenario.microbatches
    points = extrapolation_points(m, p, p if scenario.strategy.schedule == "interleaved" else 1)
    times, topology = [], topologies.build(scenario.cluster.topology, scenario.cluster.gpus)  # routes found once
    network_times: dict = {}
    for k in points:
        short = _scenario(case, k)
        plan = build_plan(short)
        times.append(Simulator(plan, short, topology).run() if exact
                      else fast.step_time(plan, short, topology, network_times))
    return extrapolate(times, points, m)


def layer_time(case: dict, phase: str) -> float:
    """One layer's forward or backward per micro-batch, its communication included: from the start of
    the middle layer's first kernel to the start of the next layer's, one micro-batch, no pipeline."""
    scenario = _scenario({**case, "model": {**case["model"], "layers": 3}, "batch": case["micro_batch"]
                          * case["layout"]["gpus"] // case["layout"]["tp"]})
    sim = _run(scenario)
    prog, times = sim.plan.programs[0], sim.times[0]
    starts = {}
    for op in prog.ops:
        if isinstance(op, Compute) and op.phase == phase and op.unit not in starts:
            starts[op.unit] = times[op.id][1]
    nxt = 3 if phase == "fwd" else 1
    return abs(starts[nxt] - starts[2])


def simulate_case(case: dict, exact: bool = False) -> float:
    q = case["quantity"]
    if q == "busbw_GBps":
        c = case["collective"]
        topology = topologies.build(_hardware(case), c["gpus"])
        return simulate_collective(topology, c["op"], c.get("algo"), int(c["bytes"])).busbw_Bps / 1e9
    if q in ("layer_forward_ms", "layer_backward_ms"):
        return 1e3 * layer_time(case, "fwd" if q == "layer_forward_ms" else "bwd")
    if q == "tokens_per_gpu_s":
        return case["batch"] * case["model"]["seq"] / (step_time(case, exact) * case["layout"]["gpus"])
    if q == "tflops_per_gpu":
        t = step_time(case, exact)
        m, lay, batch = case["model"], case["layout"], case["batch"]
        if case.get("flops", "model") == "narayanan":
            s, h, l, v = m["seq"], m["hidden"], m["layers"], m["vocab"]
            flops = 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        else:
            flops = model_flops(_scenario(case))
        return flops / (t * lay["gpus"]) / 1e12
    raise SimparError(f"quantity: unknown {q!r}; choose from {', '.join(QUANTITIES)}")


def run_case(case: dict, exact: bool = False) -> dict:
    row = {"id": case.get("id", "?"), "set": case.get("set", "?"), "source": case.get("source", ""),
           "quantity": case.get("quantity"), "measured": case.get("measured")}
    try:
        simulated = simulate_case(case, exact)
    except SimparError as exc:
        return {**row, "skipped": str(exc)}
    except (KeyError, TypeError, ValueError) as exc:
        return {**row, "skipped": f"malformed entry: {exc!r}"}
    return {**row, "simulated": simulated, "error": (simulated - case["measured"]) / case["measured"]}


def summary(rows: list[dict], sets=REFEREE_SETS) -> dict:
    mine = [r for r in rows if r["set"] in sets]
    errors = [abs(r["error"]) for r in mine if "error" in r]
    return {"cases": len(errors), "mean_abs_error": statistics.fmean(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "skipped": [{"id": r["id"], "why": r["skipped"]} for r in mine if "skipped" in r]}
