"""``simpar plot``: draw a saved run (``simpar run --json``) to an image."""

from __future__ import annotations

import json

from simpar.cli.common import add_cluster_flags, cluster_choice
from simpar.errors import SimparError


HELP_PANELS = "timeline, memory, memory-time, links, compare"  # plots.PANELS (plots.py imports matplotlib)


def register(sub) -> None:
    p = sub.add_parser("plot", help="draw a saved run (timeline, memory, traffic, sim vs real) or a cluster",
                       description="Draw what a 'simpar run --json FILE' result holds: the per-rank timeline "
                                   "(needs --op-timeline), memory per rank by category, memory over the step "
                                   "(needs --memory-timeline), traffic per link, and with --compare-real "
                                   "simulated vs measured. With --topology or --cluster instead of a result: "
                                   "draw that cluster (boxes, switches, links and their bandwidths).")
    p.add_argument("result", nargs="?", help="a JSON file written by 'simpar run --json'")
    p.add_argument("--topology", help="draw this topology preset instead of a result")
    add_cluster_flags(p)
    p.add_argument("--gpus", help="with --topology/--cluster: GPUs to draw (default 16; all of a --cluster's)")
    p.add_argument("--bandwidth", help="ring/star only: link bandwidth, e.g. 100GB/s")
    p.add_argument("--latency", help="ring/star only: per-hop latency in seconds")
    p.add_argument("--out", help="image to write (default simpar-run.png, or simpar-topology.png; the suffix "
                                 "picks the format: png, svg, pdf)")
    p.add_argument("--panels", help=f"comma-separated, from {HELP_PANELS} (default: all the file has "
                                    "data for)")
    p.set_defaults(handler=run)


def draw_topology(args) -> int:
    from simpar import topologies, units
    from simpar.topology_plot import draw_cluster

    if args.result is not None or args.panels:
        raise SimparError("--topology: draws a cluster, not a result; leave the result file and --panels out")
    name, gpus = cluster_choice(args, "dgx-a100", 16)
    bandwidth = None if args.bandwidth is None else units.positive(args.bandwidth, "--bandwidth")
    latency = None if args.latency is None else units.non_negative(args.latency, "--latency")
    out = "simpar-topology.png" if args.out is None else args.out
    draw_cluster(topologies.build(name, gpus, bandwidth, latency, args.device), out)
    print(f"figure: {out}")
    return 0


def run(args) -> int:
    from simpar.plots import PANELS, save_figure

    if args.topology is not None or args.cluster is not None:
        return draw_topology(args)
    if args.result is None:
        raise SimparError("result: give a 'simpar run --json' file to draw, or --topology/--cluster for a cluster")
    for flag in ("gpus", "device", "bandwidth", "latency"):
        if getattr(args, flag) is not None:
            raise SimparError(f"--{flag}: only with --topology or --cluster")
    args.out = args.out or "simpar-run.png"
    try:
        with open(args.result) as handle:
            result = json.load(handle)
    except OSError as exc:
        raise SimparError(f"result: cannot read {args.result!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SimparError(f"result: {args.result} is not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(result, dict) or not isinstance(result.get("sim"), dict):
        raise SimparError(f"result: {args.result} is not 'simpar run --json' output (no 'sim' part)")
    panels = None
    if args.panels:
        panels = [p.strip().lower() for p in args.panels.split(",") if p.strip()]
        unknown = [p for p in panels if p not in PANELS]
        if unknown:
            raise SimparError(f"--panels: unknown {', '.join(unknown)}; choose from {', '.join(PANELS)}")
    save_figure(result, args.out, panels)
    print(f"figure: {args.out}")
    return 0
