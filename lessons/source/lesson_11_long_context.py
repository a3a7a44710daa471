"""Lesson 11 - Long context: context parallelism by ring attention and Ulysses."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 11 - Long context: ring attention and Ulysses

A 128K-token sequence's activations outgrow a GPU even with tensor parallelism, unless every layer is
recomputed (a third more compute), and attention's work grows with the square of its length. **Context parallelism**
splits each sequence over C ranks that hold the same weights:

* **Ring attention** (Liu et al. 2023; zig-zag placement from Megatron-LM's CP): each rank keeps its
  queries and passes its key/value block round the ring, C−1 exchanges a pass, each overlapped with
  the attention on the block it holds. Every rank holds two chunks of the sequence, one from each end,
  so the causal mask leaves each rank the same work.
* **DeepSpeed-Ulysses** (Jacobs et al. 2023): an all-to-all turns "my tokens, all heads" into "all
  tokens, my heads", attention runs locally, and a second all-to-all turns it back. The heads must
  divide over tp × C.

Gradients are reduced over dp × C: the C ranks of a sequence hold the same weights."""),
    code(SETUP + """
from dataclasses import replace

from simpar.collectives import expand
from simpar.plan import Collective
from simpar.sim import build_topology
from simpar.strategies import build_plan

LONG = replace(model("llama2-7b"), seq=131072)  # LLaMA-2-7B at 128K tokens


def context_bytes(scenario):
    \"\"\"Bytes rank 0 sends a step in its context-parallel group's exchanges.\"\"\"
    plan, topology = build_plan(scenario), build_topology(scenario)
    program, total = plan.programs[0], 0
    for op in program.ops:
        if isinstance(op, Collective) and op.group == "cp":
            names = [topology.gpus[r] for r in plan.groups(program, op.group)[0]]
            for phase in expand(op.op, op.algo, topology, names, op.nbytes, itemsize=op.itemsize):
                total += sum(t.nbytes for t in phase.transfers if t.src == names[0])
    return total"""),
    md("""
## The memory of a 128K-token sequence

One node (tp 8 with sequence parallelism, selective recomputation, flash attention) and then 2 to 8
nodes splitting the sequence: the activations a rank holds fall as 1/C, and so do the optimizer states
(sharded over dp × C). On one node the step does not fit an 80 GB A100 (simulated without the memory
check, to see by how much); full recomputation would fit it, at a third more compute a step."""),
    code("""
cps, rows = [1, 2, 4, 8], {}
for cp in cps:
    scenario = make_scenario(LONG, "3d", 8 * cp, tp=8, cp=cp, sequence_parallel=True, recompute="selective",
                             flash_attention=True)
    result = simulate(scenario, check_oom=False)
    memory = result.ranks[0]["memory"]
    rows[cp] = {k: memory[k] / 2**30 for k in ("params", "grads", "optimizer", "activations", "temporaries")}
    print(f"cp {cp}: peak {memory['peak'] / 2**30:5.1f} GiB, activations {rows[cp]['activations']:5.2f} GiB, "
          f"step {units.human_time(result.step_time_s)}")
fig, ax = plt.subplots(figsize=(8, 4))
bottom = [0.0] * len(cps)
for category in ("params", "grads", "optimizer", "activations", "temporaries"):
    values = [rows[cp][category] for cp in cps]
    ax.bar([str(cp) for cp in cps], values, bottom=bottom, label=category, color=plots.CATEGORY_COLOURS[category])
    bottom = [b + v for b, v in zip(bottom, values)]
ax.axhline(80e9 / 2**30, color="black", linestyle="--", label="A100 80 GB")
ax.set_xlabel("context-parallel degree C (8 GPUs each)")
ax.set_ylabel("GiB per GPU")
ax.set_title("LLaMA-2-7B, one 128K-token sequence")
ax.legend();"""),
    md("""
Without flash attention the score matrices alone would need tens of GiB: `flash_attention=False`
above shows it. Ring attention computes block by block with an online softmax for the same reason.

## Ring vs Ulysses: traffic and time

tp 2 inside a node, C from 2 to 16 (full recomputation, so that C = 2 fits): ring sends C−1 key/value blocks a pass, nearly the whole K/V of
the sequence whatever C is, while Ulysses' all-to-alls send (C−1)/C of a rank's own q, k, v and
output, which shrink as 1/C. Once the ring leaves a node (C = 8: 16 GPUs) its blocks cross the
network and no longer hide behind the block compute."""),
    code("""
cps, traffic, exposed = [2, 4, 8, 16], {"ring": [], "ulysses": []}, {"ring": [], "ulysses": []}
for cp in cps:
    for algo in traffic:
        scenario = make_scenario(LONG, "3d", 2 * cp, tp=2, cp=cp, cp_algo=algo, sequence_parallel=True,
                                 recompute="full", flash_attention=True)
        result = simulate(scenario)
        traffic[algo].append(context_bytes(scenario) / 2**30)
        exposed[algo].append(result.breakdown["communication"])
        print(f"cp {cp:>2} {algo:<8} sends {traffic[algo][-1]:6.1f} GiB a step, step "
              f"{units.human_time(result.step_time_s)}, exposed communication {units.human_time(exposed[algo][-1])}")
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
plots.plot_series(axes[0], cps, traffic, "C", "GiB rank 0 sends in CP exchanges a step", "traffic", logx=True)
plots.plot_series(axes[1], cps, exposed, "C", "s", "communication left exposed", logx=True)"""),
    md("""
## Where each breaks down

Ulysses needs the heads to divide: LLaMA-2-7B's 32 heads allow tp × C ≤ 32, and a grouped-query model
runs out sooner (LLaMA-3-8B has 8 key/value heads, so tp 8 leaves no room for C). Ring attention has
no such limit; it needs each block's attention to take longer than the block's transfer."""),
    code("""
from simpar.errors import SimparError

for name, tp, cp in (("llama2-7b", 8, 4), ("llama2-7b", 8, 8), ("llama3-8b", 8, 2)):
    try:
        make_scenario(replace(model(name), seq=131072), "3d", tp * cp, tp=tp, cp=cp, cp_algo="ulysses")
        print(f"{name} tp {tp} x cp {cp}: Ulysses fits")
    except SimparError as error:
        print(f"{name} tp {tp} x cp {cp}: {error}")"""),
    md("## Measured: both algorithms on two gloo ranks"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

for algo in ("ring", "ulysses"):
    scenario = make_scenario(model("tiny"), "3d", 2, cp=2, cp_algo=algo, topology="cpu-host", precision="fp32")
    real, sim = run_real(scenario, steps=2), simulate(scenario, topology=cpu_topology(2))
    print(f"{algo:<8} measured {[r['bytes_sent'] for r in real['ranks']]} B, simulated "
          f"{[r['bytes_sent'] for r in sim.ranks]} B a rank a step; losses {[round(x, 4) for x in real['losses']]}")"""),
    md("""
## Takeaway

Context parallelism divides a long sequence's activations by C where tensor parallelism cannot go
further. Ring attention works for any head count and hides its exchanges while each block's attention
outlasts its transfer, which holds inside a node; Ulysses sends less as C grows but is capped by the
(key/value) heads. The executor performs both, an online softmax over ring blocks and real all-to-alls,
and moves exactly the simulated bytes."""),
]
