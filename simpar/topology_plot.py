"""Draw a cluster: its boxes side by side (GPUs at the bottom, PCIe and the CPU above them), the
network's switches on top, every link coloured by kind and labelled in the legend by bandwidth."""

from __future__ import annotations

import math
import sys

import matplotlib

if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")  # headless unless a notebook already chose a backend
import matplotlib.pyplot as plt  # noqa: E402

from simpar.topologies.graph import Topology  # noqa: E402

# Row (height) of each node kind inside a box; fabric switches sit above every box.
_ROWS = {"gpu": 0.0, "nvswitch": 1.0, "pcie-switch": 2.0, "nic": 2.0, "root": 3.0, "host": 4.0, "nvme": 4.0}
_MARKERS = {"gpu": ("s", "tab:green"), "nvswitch": ("D", "tab:olive"), "pcie-switch": ("o", "tab:gray"),
            "nic": ("^", "tab:purple"), "root": ("h", "tab:blue"), "host": ("P", "tab:blue"),
            "nvme": ("v", "tab:brown"), "server": ("*", "tab:red")}
_LINKS = {"nvlink": "tab:green", "pcie": "tab:gray", "ib": "tab:purple", "eth": "tab:orange",
          "membus": "tab:blue", "wire": "tab:cyan"}


def _positions(topology: Topology, boxes: list) -> dict[str, tuple[float, float]]:
    graph, width = topology.graph, 10.0
    pos: dict[str, tuple[float, float]] = {}
    for b, box in enumerate(boxes):
        rows: dict[float, list[str]] = {}
        for node, data in graph.nodes(data=True):
            if data["machine"] == box and data["kind"] in _ROWS:
                rows.setdefault(_ROWS[data["kind"]], []).append(node)
        for row, nodes in rows.items():
            if row == 2.0:  # PCIe switches left of centre, NICs on the right half of the same row
                nodes.sort(key=lambda n: (graph.nodes[n]["kind"] != "pcie-switch", n))
            for i, node in enumerate(nodes):
                pos[node] = (b * (width + 2) + width * (i + 0.5) / len(nodes), row)
    fabric = [n for n, d in graph.nodes(data=True) if d["machine"] is None or d["kind"] == "server"]
    tiers: dict[float, list[str]] = {}
    for node in fabric:  # a switch with links only to other switches is a core or spine: one tier higher
        switch_only = all(graph.nodes[v]["machine"] is None for v in graph.neighbors(node))
        tiers.setdefault(7.0 if switch_only and graph.degree(node) > 0 else 5.5, []).append(node)
    span = max(len(boxes), 1) * (width + 2) - 2
    for row, nodes in tiers.items():
        for i, node in enumerate(sorted(nodes)):
            pos[node] = (span * (i + 0.5) / len(nodes), row)
    return pos


def draw_cluster(topology: Topology, path: str, max_boxes: int = 4) -> None:
    """Save a drawing of ``topology`` (its first ``max_boxes`` boxes) to ``path``."""
    graph = topology.graph
    machines = sorted({d["machine"] for _, d in graph.nodes(data=True)
                       if d["machine"] is not None and d["kind"] != "server"})
    boxes = machines[:max_boxes]
    pos = _positions(topology, boxes)
    fig, ax = plt.subplots(figsize=(max(8.0, 4.5 * len(boxes)), 6.5))
    legend = {}
    for a, b, data in graph.edges(data=True):
        if a not in pos or b not in pos:
            continue
        link = data["link"]
        label = f"{link.kind} {link.bandwidth / 1e9:g} GB/s"
        line, = ax.plot([pos[a][0], pos[b][0]], [pos[a][1], pos[b][1]], color=_LINKS.get(link.kind, "black"),
                        linewidth=0.6 + 0.6 * math.log10(max(link.bandwidth / 1e9, 1.0)), alpha=0.7, zorder=1)
        legend.setdefault(label, line)
    for node, (x, y) in pos.items():
        kind = graph.nodes[node]["kind"]
        marker, colour = _MARKERS.get(kind, ("o", "black"))
        ax.scatter([x], [y], marker=marker, s=90, color=colour, zorder=2)
        if kind in ("gpu", "nic") and len(pos) > 120:
            continue  # too many to read: the markers say it
        ax.annotate(node.split(".")[-1], (x, y), textcoords="offset points", xytext=(0, -12 if kind == "gpu" else 7),
                    ha="center", fontsize=6)
    hidden = len(machines) - len(boxes)
    title = f"{topology.name}: {topology.description}"
    if hidden:
        title += f"\n(first {len(boxes)} of {len(machines)} boxes drawn)"
    ax.set_title(title, fontsize=9)
    ax.legend(legend.values(), legend.keys(), fontsize=7, loc="upper right", title="links (per direction)",
              title_fontsize=7)
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
