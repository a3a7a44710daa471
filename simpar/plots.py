"""Figures of a run (matplotlib): per-rank timeline, memory per rank and over time, traffic per
link, simulated vs measured. Each ``plot_*`` draws on an Axes the caller gives (the lessons use
them one by one); ``run_figure`` lays out every panel a run's JSON has data for.

The inputs are the parts of ``simpar run --json`` output: ``sim`` (and ``real``, ``comparison``
with --compare-real); the timeline needs ``op_timeline`` (--op-timeline), memory over time
``memory_timeline`` (--memory-timeline).
"""

from __future__ import annotations

import sys

import matplotlib

if "ipykernel" not in sys.modules:  # notebooks draw inline; everywhere else, files only (no screen)
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simpar.errors import SimparError  # noqa: E402
from simpar.plan import CATEGORIES, OP_CLASSES, STREAMS  # noqa: E402

CLASS_COLOURS = dict(zip(OP_CLASSES, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")))
CATEGORY_COLOURS = dict(zip(CATEGORIES, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:gray", "tab:olive")))
PANELS = ("timeline", "memory", "memory-time", "links", "compare")
MiB = 2**20


def _ranks(op_timeline: list[dict], max_ranks: int) -> list[tuple[int, list[dict]]]:
    rows = sorted((rank, program["ops"]) for program in op_timeline for rank in program["ranks"])
    if len(rows) <= max_ranks:
        return rows
    return sorted((program["ranks"][0], program["ops"]) for program in op_timeline)[:max_ranks]


WEIGHT_GRADS = "backward W"  # a zero-bubble schedule's deferred weight-gradient pass, drawn apart from B
CLASS_COLOURS[WEIGHT_GRADS] = "tab:cyan"


def split_weight_grads(op_timeline: list[dict], plan) -> list[dict]:
    """``op_timeline`` with the weight-gradient ops (W) of ``plan``'s zero-bubble schedule in a class of
    their own, so a timeline shows B and W apart."""
    def relabel(program: dict, entry: dict) -> dict:
        op = plan.program_of(program["ranks"][0]).ops[entry["op"]]
        is_w = getattr(op, "phase", "") == "bwd" and getattr(op, "part", "").endswith("/weight")
        return {**entry, "class": WEIGHT_GRADS} if is_w else entry
    return [{**program, "ops": [relabel(program, e) for e in program["ops"]]} for program in op_timeline]


def plot_timeline(ax, op_timeline: list[dict], title: str = "timeline", max_ranks: int = 16) -> None:
    """One row per rank, one lane per stream inside it, ops coloured by class: gaps on the compute
    lane are where the rank waits (a pipeline's bubble, exposed communication)."""
    rows = _ranks(op_timeline, max_ranks)
    used = [s for s in STREAMS if any(e["stream"] == s for _, ops in rows for e in ops)]
    lane = 1.0 / max(len(used), 1)
    bars: dict[tuple, list] = {}  # one broken_barh per lane and class: thousands of ops draw in one call each
    for y, (rank, ops) in enumerate(rows):
        for entry in ops:
            key = (y + used.index(entry["stream"]) * lane, entry["class"], entry["stream"] == "recv")
            bars.setdefault(key, []).append((1e3 * entry["start"], 1e3 * (entry["end"] - entry["start"])))
    seen = set()
    for (bottom, kind, receive), spans in bars.items():
        # a posted receive spans its wait: drawn faint, so the work stays readable
        ax.broken_barh(spans, (bottom, lane * 0.9), color=CLASS_COLOURS[kind], alpha=0.3 if receive else 1.0,
                       label=None if kind in seen else kind)
        seen.add(kind)
    ax.set_yticks([y + 0.5 for y in range(len(rows))], [f"rank {rank}" for rank, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(f"{title} (lanes per rank: {', '.join(used)})")
    ax.legend(loc="upper right", fontsize="small")


def plot_memory_by_rank(ax, ranks: list[dict], title: str = "memory per rank") -> None:
    """Stacked bars: the most each category held on each rank (GiB)."""
    labels = [str(r["rank"]) for r in ranks]
    bottom = [0.0] * len(ranks)
    for category in CATEGORIES:
        values = [r["memory"].get(category, 0) / 2**30 for r in ranks]
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=category, color=CATEGORY_COLOURS[category])
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("rank")
    ax.set_ylabel("GiB (peak of each category)")
    ax.set_title(title)
    ax.legend(fontsize="small")


def plot_memory_over_time(ax, memory_timeline: list[dict], title: str = "memory over the step") -> None:
    """GPU bytes per category over the step, stacked, for the program with the highest peak."""
    program = max(memory_timeline, key=lambda p: max((total for _, total in p["points"]), default=0))
    points = program["by_category"]
    times = [1e3 * t for t, _ in points]
    stacks = [[values[i] / 2**30 for _, values in points] for i in range(len(program["categories"]))]
    ax.stackplot(times, stacks, labels=program["categories"], step="post",
                 colors=[CATEGORY_COLOURS.get(c, "tab:gray") for c in program["categories"]])
    ax.set_xlabel("time in the step (ms)")
    ax.set_ylabel("GiB on the GPU")
    ax.set_title(f"{title} ({program['program']}, ranks {program['ranks'][0]}..{program['ranks'][-1]})")
    ax.legend(loc="upper left", fontsize="small")


def plot_links(ax, links: list[dict], title: str = "traffic per link", top: int = 12) -> None:
    """Bytes carried by the busiest links (MiB), one bar each."""
    chosen = links[:top][::-1]
    ax.barh([f"{link['name']} ({link['kind']})" for link in chosen], [link["bytes"] / MiB for link in chosen])
    ax.set_xlabel("MiB carried in the step")
    ax.set_title(f"{title} (busiest {len(chosen)} of {len(links)})")


def plot_sim_vs_real(ax, comparison: dict, title: str = "simulated vs measured") -> None:
    """Step time and time per op class (mean per rank), simulated beside measured, in ms."""
    rows = [("step time", comparison["step_time_s"])]
    rows += [(kind, row) for kind, row in comparison["op_time_s"].items() if row["sim"] or row["real"]]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [1e3 * row["sim"] for _, row in rows], width=0.4, label="simulated")
    ax.bar([x + 0.2 for x in xs], [1e3 * (row["real"] or 0) for _, row in rows], width=0.4, label="measured")
    ax.set_xticks(list(xs), [label for label, _ in rows], rotation=20, ha="right")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(fontsize="small")


def plot_series(ax, x, series: dict[str, list], xlabel: str, ylabel: str, title: str = "",
                logx: bool = False, logy: bool = False) -> None:
    """Lines of ``series`` (label -> y values) against ``x``: sweeps over GPUs, sizes, micro-batches."""
    for label, ys in series.items():
        ax.plot(x, ys, marker="o", label=label)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def plot_bars(ax, values: dict[str, float], ylabel: str, title: str = "", colour: str = "tab:blue") -> None:
    """One bar per label (step time per strategy, bytes per rank...)."""
    ax.bar(list(values), list(values.values()), color=colour)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=20)


def available_panels(result: dict) -> list[str]:
    sim = result.get("sim", {})
    have = {"timeline": "op_timeline" in sim, "memory": bool(sim.get("ranks")),
            "memory-time": bool(sim.get("memory_timeline")), "links": bool(sim.get("links")),
            "compare": "comparison" in result}
    return [panel for panel in PANELS if have[panel]]


def run_figure(result: dict, panels: list[str] | None = None):
    """A figure with the asked ``panels`` (default: all the result has data for)."""
    have = available_panels(result)
    panels = panels or have
    missing = [p for p in panels if p not in have]
    if missing:
        hints = {"timeline": "--op-timeline", "memory-time": "--memory-timeline", "compare": "--compare-real",
                 "links": "a topology with links", "memory": "per-rank results"}
        raise SimparError("--panels: the run has no data for " + ", ".join(f"{p} (needs {hints[p]})" for p in missing))
    if not panels:
        raise SimparError("the run has nothing to plot (is this 'simpar run --json' output?)")
    sim = result["sim"]
    timelines = [("timeline", sim.get("op_timeline"), "simulated")]
    if "timeline" in panels and result.get("real", {}).get("op_timeline"):
        timelines.append(("timeline", result["real"]["op_timeline"], "measured"))
    rows = len(panels) + (len(timelines) - 1 if "timeline" in panels else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(12, 3.6 * rows), squeeze=False)
    axes = iter(axes[:, 0])
    for panel in panels:
        if panel == "timeline":
            for _, timeline, source in timelines:
                plot_timeline(next(axes), timeline, f"{source} timeline")
        elif panel == "memory":
            plot_memory_by_rank(next(axes), sim["ranks"])
        elif panel == "memory-time":
            plot_memory_over_time(next(axes), sim["memory_timeline"])
        elif panel == "links":
            plot_links(next(axes), sim["links"])
        elif panel == "compare":
            plot_sim_vs_real(next(axes), result["comparison"])
    scenario = result.get("scenario", {})
    if scenario:
        strategy = scenario["strategy"]
        fig.suptitle(f"{strategy['name']} on {scenario['cluster']['gpus']} GPUs "
                     f"({scenario['cluster']['topology']}): {scenario['model']}, "
                     f"dp {strategy['dp']} x pp {strategy['pp']} x tp {strategy['tp']}"
                     + (f", ep {strategy['ep']}" if strategy.get("ep", 1) > 1 else ""))
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    return fig


def save_figure(result: dict, path: str, panels: list[str] | None = None) -> None:
    fig = run_figure(result, panels)
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as exc:
        raise SimparError(f"--plot: cannot write {path!r}: {exc}") from None
    finally:
        plt.close(fig)
