"""What the sub-commands share: their flags, JSON output, a scenario as JSON, the figures of a run."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from simpar import units
from simpar.errors import SimparError
from simpar.models import ModelSpec
from simpar.scenario import Scenario
from simpar.strategies import build_plan


def add_json_flag(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    parser.add_argument("--json", metavar="PATH|-", help=f"write {what} as JSON ('-': stdout, nothing else)")


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", metavar="PATH",
                        help="a cluster file (YAML or JSON, docs/clusters.md) instead of --topology; 'simpar "
                             "topologies --show NAME' prints a preset as one to start from")
    parser.add_argument("--device", help="swap the topology's GPU for this preset (see 'simpar devices'), e.g. h200")


def add_seq_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq", help="tokens per sequence, replacing the model's own (e.g. 131072 for 128K-token "
                                      "context; split it over ranks with --cp)")


def with_seq(args, spec: ModelSpec) -> ModelSpec:
    """``spec`` at --seq tokens a sequence, when given."""
    if getattr(args, "seq", None) is None:
        return spec
    return replace(spec, seq=units.positive_int(args.seq, "--seq"))


def cluster_choice(args, default_topology: str, default_gpus: int) -> tuple[str, int]:
    """(preset name or cluster file, GPUs) from --topology, --cluster and --gpus; with a cluster file
    --gpus defaults to all of its GPUs."""
    from simpar import units
    from simpar.topologies.cluster_file import is_cluster_file, load

    cluster = getattr(args, "cluster", None)
    if cluster is not None and getattr(args, "topology", None) is not None:
        raise SimparError("--cluster: a cluster file is the whole topology; leave --topology out")
    if cluster is not None:
        gpus = load(cluster).gpus if args.gpus is None else units.positive_int(args.gpus, "--gpus")
        return cluster, gpus
    topology = (args.topology or default_topology).strip()
    return topology if is_cluster_file(topology) else topology.lower(), \
        units.positive_int(default_gpus if args.gpus is None else args.gpus, "--gpus")


def write_json(data, destination: str) -> bool:
    """``-`` prints to stdout; anything else is a file path. Returns True when the JSON went to
    stdout, i.e. the command should print nothing more."""
    text = json.dumps(data, indent=2)
    if destination == "-":
        print(text)
        return True
    try:
        with open(destination, "w") as handle:
            handle.write(text + "\n")
    except OSError as exc:
        raise SimparError(f"--json: cannot write {destination!r}: {exc.strerror}") from None
    return False


def is_gpu_profile(path: str) -> bool:
    """Whether ``path`` is a GPU profile (simpar calibrate --backend nccl); unreadable files are left
    for the profile loader to report."""
    try:
        with open(path) as handle:
            return json.load(handle).get("kind") == "gpu"
    except (OSError, ValueError, AttributeError):
        return False


def scenario_json(scenario: Scenario) -> dict:
    data = {"model": scenario.model.name, "params": scenario.model.params, "train": asdict(scenario.train),
            "strategy": asdict(scenario.strategy), "cluster": asdict(scenario.cluster),
            "microbatches": scenario.microbatches}
    if scenario.model.experts:
        from simpar.models.moe import step_summary

        data["active_params"], data["moe"] = scenario.model.active_params, step_summary(scenario)
    return data


def write_figures(args, scenario: Scenario, result: dict) -> list[str]:
    """--trace and --plot of ``result`` (scenario, sim with every timeline, real); what was written."""
    wrote = []
    if args.trace:
        from simpar.trace import build_trace, write_trace

        title = f"{scenario.strategy.name} on {scenario.cluster.gpus} GPUs: {scenario.model.name}"
        write_trace(args.trace, build_trace(build_plan(scenario), result["sim"], result.get("real"), title))
        wrote.append(f"trace: {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    if args.plot:
        from simpar.plots import save_figure  # imports matplotlib: only when asked

        save_figure(result, args.plot)
        wrote.append(f"figure: {args.plot}")
    return wrote


def loss_summary(losses: list[float], shown: int = 3) -> str:
    """The losses of a run for one line: all of a short run, the first and last ``shown`` of a long one
    (``validate``-length runs take hundreds of steps)."""
    if len(losses) <= 2 * shown + 1:
        return ", ".join(f"{x:.4f}" for x in losses)
    return ", ".join(f"{x:.4f}" for x in losses[:shown]) + ", ..., " + ", ".join(f"{x:.4f}" for x in losses[-shown:])
