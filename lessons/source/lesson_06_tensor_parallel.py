"""Lesson 6 - Tensor parallelism and 3D layouts."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 6 - Tensor parallelism and 3D layouts

Megatron splits each layer's matrices: the first MLP matrix (and Q, K, V) by columns, the second
(and the attention output) by rows, so a layer needs one all-reduce of b·s·h activations after
attention and one after the MLP in forward, two more in backward. That traffic is per layer and
per micro-batch, so TP belongs on NVLink inside a machine."""),
    code(SETUP),
    md("## TP traffic, counted"),
    code("""
m = model("gpt2")
r = simulate(make_scenario(m, "tp", 4, topology="dgx-a100", micro_batch=1))
activation = 2 * m.seq * m.hidden  # bytes of one b*s*h bf16 activation, b = 1
per_all_reduce = activation * 2 * 3 / 4  # a ring all-reduce sends 2(N-1)/N of it, N = 4
print(f"rank 0 sends {r.ranks[0]['bytes_sent'] / 2**20:.1f} MiB per step = "
      f"{r.ranks[0]['bytes_sent'] / per_all_reduce:.2f} all-reduces of one b*s*h activation "
      f"({activation / 2**20:.2f} MiB): 4 per layer x {m.layers} layers, 2 for embedding and head, "
      "and two tiny cross-entropy ones")"""),
    md("## Why TP stays inside a node"),
    code("""
m = model("llama2-7b")
step, comm = {}, {}
for tp, dp in [(8, 2), (16, 1)]:  # the same 16 GPUs and global batch; TP 16 spans both machines
    r = simulate(make_scenario(m, "3d", 16, tp=tp, dp=dp, topology="dgx-a100", recompute="full",
                               micro_batch=1, global_batch=16))
    label = f"tp {tp} x dp {dp}"
    step[label], comm[label] = r.step_time_s, r.breakdown["communication"]
    print(f"{label}: step {units.human_time(r.step_time_s)}, exposed communication "
          f"{units.human_time(r.breakdown['communication'])}, {r.ranks[0]['bytes_sent'] / 2**30:.0f} GiB sent per rank")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
plots.plot_bars(axes[0], step, "s", "llama2-7b on 16 A100s: step")
plots.plot_bars(axes[1], comm, "s", "exposed communication", colour="tab:red")"""),
    md("## A 3D layout for a large model: search"),
    code("""
from simpar.search import Search, ranked, run_search

args = (model("llama2-70b"), 64, "dgx-a100", 128, "bf16-mixed", "adam", None)
todo = [c for c in Search(*args).candidates(("3d", "zero3")) if c.recompute != "none"]
outcomes = run_search(args, todo, jobs=2)
best = ranked(outcomes)
print(f"{len(todo)} layouts, {len(best)} fit in 80 GB")
for o in best[:5]:
    print(f"  {o.candidate.describe():<70} {units.human_time(o.step_time_s)}")
fig, ax = plt.subplots(figsize=(8, 3))
plots.plot_bars(ax, {o.candidate.describe().split(',')[0]: o.step_time_s for o in best[:5]}, "s / step",
                "fastest 5 layouts of llama2-70b on 64 A100s")"""),
    md("## For real: TP on 2 CPU ranks moves the simulated bytes"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

scenario = make_scenario(model("tiny"), "tp", 2, topology="cpu-host", precision="fp32")
real, sim = run_real(scenario, steps=2), simulate(scenario, topology=cpu_topology(2))
print("measured", [r["bytes_sent"] for r in real["ranks"]], "simulated", [r["bytes_sent"] for r in sim.ranks])"""),
    md("""
## Takeaway

TP's all-reduces happen inside every layer, so they need NVLink bandwidth: spanning nodes with TP
makes communication dominate. Large models combine TP inside a node, pipeline stages across
nodes and data parallelism (with ZeRO) over the rest; the search finds the split."""),
]
