"""Lesson 10 - ZeRO++ and hybrid sharding: ZeRO-3 across slow links."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 10 - ZeRO-3 across nodes: ZeRO++ and HSDP

ZeRO-3 gathers every layer's weights twice a step (forward, backward) and reduce-scatters its gradients:
3Φ of traffic per rank, most of it over the network once ranks span nodes. Two answers:

* **ZeRO++** (Wang et al. 2023): **qwZ** gathers int8 weights (half the bytes), **hpZ** keeps a second
  copy of the weights sharded inside each node so backward gathers never leave it, **qgZ** reduce-scatters
  int4 gradients hierarchically (a quarter of the bytes, most inside the node).
* **HSDP** (PyTorch's hybrid sharding): shard inside a node, replicate across nodes; only an all-reduce of
  each node's gradient shard crosses the network."""),
    code(SETUP + """
from simpar.collectives import expand
from simpar.sim import build_topology
from simpar.strategies import build_plan
from simpar.plan import Collective


def cross_node_bytes(scenario):
    \"\"\"Bytes a step sends from one node to another, per rank.\"\"\"
    plan, topology = build_plan(scenario), build_topology(scenario)
    total = 0
    for op in plan.programs[0].ops:
        if isinstance(op, Collective):
            for group in plan.groups(plan.programs[0], op.group):
                names = [topology.gpus[r] for r in group]
                for phase in expand(op.op, op.algo, topology, names, op.nbytes, itemsize=op.itemsize):
                    total += sum(t.nbytes for t in phase.transfers if topology.machine(t.src) != topology.machine(t.dst))
    return total / scenario.cluster.gpus


VARIANTS = {"ZeRO-3": ("zero3", {"gather_granularity": "layer"}), "ZeRO++ qwZ": ("zero3", {"zeropp_qwz": True}),
            "ZeRO++ qwZ+hpZ": ("zero3", {"zeropp_qwz": True, "zeropp_hpz": 8}),
            "ZeRO++ all three": ("zero3", {"zeropp_qwz": True, "zeropp_hpz": 8, "zeropp_qgz": True}),
            "HSDP": ("hsdp", {})}"""),
    md("## Cross-node bytes per rank, 2 to 16 nodes"),
    code("""
nodes = [2, 4, 8, 16]
series = {name: [] for name in VARIANTS}
for n in nodes:
    for name, (strategy, options) in VARIANTS.items():
        scenario = make_scenario(model("llama2-7b"), strategy, 8 * n, recompute="full", **options)
        series[name].append(cross_node_bytes(scenario) / 2**30)
    print(f"{n:>2} nodes: " + ", ".join(f"{k} {v[-1]:.2f} GiB" for k, v in series.items()))
fig, ax = plt.subplots(figsize=(8, 4))
plots.plot_series(ax, nodes, series, "nodes of 8 A100s", "GiB a rank sends to other nodes per step",
                  "LLaMA-2-7B: what crosses the network")"""),
    md("""
## What it costs in time and memory

hpZ holds a second, node-wide copy of the weights (Φ·2/8 more bytes per GPU); HSDP holds the model
states over 8 ranks instead of all of them."""),
    code("""
times, memory = {}, {}
for name, (strategy, options) in VARIANTS.items():
    scenario = make_scenario(model("llama2-7b"), strategy, 32, recompute="full", **options)
    result = simulate(scenario)
    times[name], memory[name] = result.step_time_s, result.ranks[0]["memory"]["peak"] / 2**30
    print(f"{name:<18} step {units.human_time(result.step_time_s):>10}, peak {memory[name]:.1f} GiB")
fig, axes = plt.subplots(1, 2, figsize=(12, 3.5))
plots.plot_bars(axes[0], times, "s", "step, 4 DGX-A100 nodes")
plots.plot_bars(axes[1], memory, "GiB", "peak memory per GPU")"""),
    md("## Measured: the executor's bytes on four gloo ranks (two 'nodes' of two)"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

for name, strategy, options in (("ZeRO-3", "zero3", {"gather_granularity": "layer"}),
                                ("ZeRO++ qwZ+hpZ+qgZ", "zero3", {"zeropp_qwz": True, "zeropp_hpz": 2, "zeropp_qgz": True}),
                                ("HSDP", "hsdp", {"shard_size": 2})):
    scenario = make_scenario(model("tiny-deep"), strategy, 4, topology="cpu-host", precision="fp32", **options)
    real = run_real(scenario, steps=2)
    sim = simulate(scenario, topology=cpu_topology(4))
    print(f"{name:<20} measured {real['ranks'][0]['bytes_sent']:>9,} B, simulated {sim.ranks[0]['bytes_sent']:>9,} B "
          f"sent by rank 0 per step; losses {[round(x, 4) for x in real['losses']]}")"""),
    md("""
## Takeaway

Across nodes ZeRO-3 pays for its memory savings with 3Φ of network traffic a step. ZeRO++ cuts what
crosses nodes several-fold (int8 gathers, backward gathers kept in the node, int4 gradients reduced
inside first) at the cost of a node-wide weight copy and quantization error; HSDP sends only an
all-reduce of each node's shard across, but holds 8-way rather than N-way shards. The executor performs
all three, quantization included, with exactly the simulated bytes."""),
]
