"""Writes the lesson notebooks from the cells below (edit here, then `python lessons/build.py`).
Notebooks are committed without outputs; the test suite runs each top to bottom (tests/test_lessons.py)."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent
SETUP = """import matplotlib.pyplot as plt
from simpar import plots, units
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import simulate"""


def md(text: str):
    return new_markdown_cell(text.strip())


def code(text: str):
    return new_code_cell(text.strip())


LESSONS = {}

LESSONS["01_data_parallel"] = [
    md("""
# Lesson 1 - Data parallelism: Worker-Server vs Ring

Every data-parallel rank computes gradients on its own micro-batch; before the optimizer step they
must be summed. Two ways:

* **Worker-Server** (parameter server): every worker pushes its Φ gradient bytes to a server, which
  sums and sends Φ back. A worker moves 2Φ, but the server moves **2NΦ**: it is the bottleneck.
* **Ring all-reduce**: a reduce-scatter then an all-gather around a ring. Every rank moves
  **2(N−1)/N·Φ** - independent of N - and no node is special.

We measure both with simpar's simulator, then for real with the reference executor."""),
    code(SETUP + """
from simpar import topologies
from simpar.collective_run import simulate_collective"""),
    md("## Bytes per worker and at the server as N grows"),
    code("""
size = 1e9  # one gigabyte of gradients
ns = [2, 4, 8, 16, 32]
worker, server, ring = [], [], []
for n in ns:
    ps = simulate_collective(topologies.build("star", n, 100e9, 5e-6), "allreduce", "ps", size)
    rg = simulate_collective(topologies.build("ring", n, 100e9, 5e-6), "allreduce", "ring", size)
    worker.append(ps.ranks[0]["bytes_sent"] / 1e9)
    server.append(ps.server["bytes_sent"] / 1e9)
    ring.append(rg.ranks[0]["bytes_sent"] / 1e9)
    print(f"N={n:>2}: worker sends {worker[-1]:.2f} GB, server {server[-1]:.1f} GB (N x size), "
          f"ring rank {ring[-1]:.3f} GB (2(N-1)/N = {2 * (n - 1) / n:.3f})")
fig, ax = plt.subplots(figsize=(7, 4))
plots.plot_series(ax, ns, {"Worker-Server: server": server, "Worker-Server: worker": worker,
                           "ring: every rank": ring}, "ranks N", "GB sent per all-reduce of 1 GB",
                  "who carries the traffic", logy=True)"""),
    md("## Time on PCIe vs NVLink"),
    code("""
times = {}
for name in ["pcie", "nvlink-full"]:
    for algo in ["ps", "ring"]:
        r = simulate_collective(topologies.build(name, 4, None, None), "allreduce", algo, size)
        times[f"{algo} on {name}"] = r.time_s * 1e3
        print(f"{algo:>4} all-reduce of 1 GB on 4 GPUs, {name:<12}: {units.human_time(r.time_s)}")
fig, ax = plt.subplots(figsize=(7, 3.5))
plots.plot_bars(ax, times, "ms", "1 GB all-reduce, 4 GPUs")"""),
    md("""
## For real: the reference executor on 2 and 4 CPU ranks

`run_real` performs the same Plan as the simulator with torch.distributed (gloo), one process per
rank, and counts every byte each rank sends. Worker-Server puts the server on rank 0."""),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

rows = {}
for n in [2, 4]:
    for strategy in ["dp", "ddp"]:
        scenario = make_scenario(model("tiny"), strategy, n, topology="cpu-host", precision="fp32")
        real = run_real(scenario, steps=2)
        sim = simulate(scenario, topology=cpu_topology(n))
        sent = [r["bytes_sent"] for r in real["ranks"]]
        assert sent == [r["bytes_sent"] for r in sim.ranks]  # measured bytes == simulated, rank by rank
        rows[f"{strategy} N={n} rank0"] = sent[0] / 1e3
        rows[f"{strategy} N={n} rank1"] = sent[1] / 1e3
        print(f"{strategy:>3} on {n} ranks: bytes sent per rank {sent} (simulated: the same)")
fig, ax = plt.subplots(figsize=(8, 3.5))
plots.plot_bars(ax, rows, "kB sent per step", "measured: rank 0 (server) vs rank 1")"""),
    md("""
## Takeaway

The ring keeps every rank's traffic at 2(N−1)/N·Φ no matter how many ranks join, while a parameter
server's traffic grows as 2NΦ and caps the whole job at its own link: that is why DDP, NCCL and
every ZeRO stage use ring (or tree) collectives. Fast links (NVLink) shrink the time, but not the
server's N-fold share. The real run moved exactly the bytes the simulator predicted."""),
]

LESSONS["02_memory"] = [
    md("""
# Lesson 2 - Memory of mixed-precision training

Model states in mixed-precision Adam take **(2 + 2 + 12)Φ** bytes: bf16 weights, bf16 gradients,
and fp32 master weights + Adam's m and v. Activations for one transformer layer (Korthikanti et
al. 2022) take **34·s·b·h + 5·a·s²·b** bytes; recomputation trades them for compute."""),
    code(SETUP + """
from simpar.memory import model_states
from simpar.train import TrainSpec"""),
    md("## LLaMA-2-7B, counted layer by layer"),
    code("""
m = model("llama2-7b")
print(f"embedding {m.embedding_params():,}   each of {m.layers} layers {m.layer_params():,}   "
      f"final norm + head {m.head_params():,}")
print(f"total {m.params:,} parameters (Meta's count: 6,738,415,616)")
states = model_states("ddp", m.params, 1, TrainSpec(global_batch=1, micro_batch=1))
print(f"model states on one GPU: params {states.params / 1e9:.1f} GB + grads {states.grads / 1e9:.1f} GB "
      f"+ optimizer {states.optimizer / 1e9:.1f} GB = {states.total / 1e9:.1f} GB "
      f"= 16 bytes x {m.params / 1e9:.2f}B")"""),
    md("## Activations: the formula and recomputation"),
    code("""
s, h, a = m.seq, m.hidden, m.heads
per_layer = {r: m.layer_activation_bytes(1, r) / 2**30 for r in ["none", "selective", "full"]}
print(f"one layer, micro-batch 1, s={s}: " + ", ".join(f"{k} {v:.2f} GiB" for k, v in per_layer.items()))
print(f"the attention scores 5*a*s^2*b alone: {5 * a * s * s / 2**30:.2f} GiB per layer")
batches = [1, 2, 4, 8]
series = {r: [m.layers * m.layer_activation_bytes(b, r) / 2**30 for b in batches] for r in per_layer}
fig, ax = plt.subplots(figsize=(7, 4))
plots.plot_series(ax, batches, series, "micro-batch", "GiB of activations (all 32 layers)",
                  "LLaMA-2-7B activations by recomputation", logy=True)"""),
    md("## What the simulator tracks per rank"),
    code("""
fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
for ax, recompute in zip(axes, ["none", "selective", "full"]):
    scenario = make_scenario(model("llama2-7b"), "zero3", 8, recompute=recompute, micro_batch=1)
    result = simulate(scenario, check_oom=False)
    plots.plot_memory_by_rank(ax, result.ranks[:4], f"zero3, 8 GPUs, recompute {recompute}")
    print(f"recompute {recompute:>9}: peak {result.ranks[0]['memory']['peak'] / 2**30:.1f} GiB, "
          f"step {units.human_time(result.step_time_s)}")"""),
    md("## For real: measured memory of a tiny model"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

scenario = make_scenario(model("tiny"), "ddp", 2, topology="cpu-host", precision="fp32")
real, sim = run_real(scenario, steps=2), simulate(scenario, topology=cpu_topology(2))
for key in ["params", "grads", "optimizer", "activations"]:
    measured, simulated = real["ranks"][0]["memory"][key], sim.ranks[0]["memory"][key]
    print(f"{key:>12}: measured {measured:>9,} B   simulated {simulated:>9,} B")"""),
    md("""
## Takeaway

16 bytes per parameter before a single activation: LLaMA-2-7B needs 108 GB of model states, more
than any one GPU. Activations grow with micro-batch and with s² for attention scores; selective
recomputation (or flash attention) removes the s² term almost for free, full recomputation keeps
only each layer's input at the cost of a second forward. The measured model states equal the
model exactly; measured activations include framework temporaries the formula leaves out."""),
]

LESSONS["03_zero"] = [
    md("""
# Lesson 3 - ZeRO stages 1, 2 and 3

ZeRO shards model states over N data-parallel ranks: stage 1 the optimizer states, stage 2 also
the gradients, stage 3 also the parameters. Traffic per rank: **2Φ** for stages 1 and 2 (a
reduce-scatter plus an all-gather, like DDP's all-reduce) and **3Φ** for stage 3 (parameters are
gathered in forward *and* backward)."""),
    code(SETUP + """
from simpar.memory import model_states
from simpar.train import TrainSpec"""),
    md("## Memory per GPU as N grows (7.5B parameters, the ZeRO paper's example)"),
    code("""
params, ns = 7_500_000_000, [1, 4, 16, 64, 256]
series = {}
for strategy in ["ddp", "zero1", "zero2", "zero3"]:
    series[strategy] = [model_states(strategy, params, n, TrainSpec(global_batch=n, micro_batch=1)).total / 1e9
                        for n in ns]
print({k: round(v[3], 1) for k, v in series.items()}, "GB at N=64 (paper: 120, 31.4, 16.6, 1.9)")
fig, ax = plt.subplots(figsize=(7, 4))
plots.plot_series(ax, ns, series, "GPUs", "GB of model states per GPU", "ZeRO memory", logx=True, logy=True)"""),
    md("## Traffic and time on DGX A100 nodes"),
    code("""
m = model("gpt2-xl")
traffic, step = {}, {}
for strategy in ["ddp", "zero1", "zero2", "zero3"]:
    result = simulate(make_scenario(m, strategy, 16, topology="dgx-a100"))
    traffic[strategy] = result.ranks[0]["bytes_sent"] / (2 * m.params)  # in units of the bf16 model
    step[strategy] = result.step_time_s * 1e3
    print(f"{strategy:>6}: sends {traffic[strategy]:.3f} x model bytes per step "
          f"(2(N-1)/N = {2 * 15 / 16:.3f}), step {units.human_time(result.step_time_s)}")
fig, axes = plt.subplots(1, 2, figsize=(12, 3.5))
plots.plot_bars(axes[0], traffic, "x bf16 model bytes", "sent per rank per step")
plots.plot_bars(axes[1], step, "ms", "gpt2-xl step, 16 GPUs (2 nodes)")"""),
    md("## Simulated vs real bytes"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

for strategy in ["zero1", "zero2", "zero3"]:
    scenario = make_scenario(model("tiny"), strategy, 2, topology="cpu-host", precision="fp32")
    real, sim = run_real(scenario, steps=2), simulate(scenario, topology=cpu_topology(2))
    print(f"{strategy}: measured {[r['bytes_sent'] for r in real['ranks']]} "
          f"simulated {[r['bytes_sent'] for r in sim.ranks]} bytes sent per rank")"""),
    md("""
## Takeaway

Stage 1 and 2 cut memory by 4x and 8x at no extra traffic; stage 3 divides everything by N for
1.5x the traffic. On fast NVSwitch nodes the difference in step time is small; across slower
networks stage 3's extra all-gathers show. The executor moves exactly the simulated bytes."""),
]

LESSONS["04_offload"] = [
    md("""
# Lesson 4 - ZeRO-Offload and ZeRO-Infinity

Offload moves optimizer states (and the optimizer step) to the CPU: the GPU keeps only 2Φ of bf16
weights. Every step then ships gradients down and parameters up over PCIe. ZeRO-Infinity goes
further and keeps parameters and optimizer states on NVMe."""),
    code(SETUP + """
from simpar.errors import SimparError"""),
    md("## What fits on one 24 GB GPU (RTX 3090 workstation)"),
    code("""
for name in ["gpt2-large", "gpt2-xl", "llama2-7b"]:
    for strategy in ["zero2", "zero2-offload", "zero3-infinity"]:
        try:
            r = simulate(make_scenario(model(name), strategy, 1, topology="workstation", recompute="full"))
            print(f"{name:>10} {strategy:>15}: fits, peak {r.ranks[0]['memory']['peak'] / 2**30:5.1f} GiB, "
                  f"step {units.human_time(r.step_time_s)}")
        except SimparError as e:
            print(f"{name:>10} {strategy:>15}: {str(e).split(':')[0]} ({str(e).split('needs ')[1][:30]}...)")"""),
    md("## PCIe is the bottleneck"),
    code("""
scenario = make_scenario(model("gpt2-xl"), "zero2-offload", 2, topology="workstation", recompute="full")
result = simulate(scenario)
print({k: units.human_time(v) for k, v in result.breakdown.items()})
fig, ax = plt.subplots(figsize=(7, 3))
plots.plot_bars(ax, {k: v * 1e3 for k, v in result.breakdown.items()}, "ms", "gpt2-xl zero2-offload, 2 x RTX 3090")"""),
    md("""
## When offload makes training slower

A user turned offload on for a model that already fit and saw 1.3 → 0.77 it/s for 3 GB saved.
The same trade-off on our model: a model that fits without offload."""),
    code("""
speeds, saved = {}, {}
for strategy in ["zero2", "zero2-offload"]:
    r = simulate(make_scenario(model("gpt2-large"), strategy, 2, topology="workstation", recompute="full"))
    speeds[strategy] = 1 / r.step_time_s
    saved[strategy] = r.ranks[0]["memory"]["peak"] / 2**30
    print(f"{strategy:>14}: {1 / r.step_time_s:.2f} it/s, peak {saved[strategy]:.1f} GiB")
print(f"offload: {speeds['zero2-offload'] / speeds['zero2']:.2f}x the speed for "
      f"{saved['zero2'] - saved['zero2-offload']:.1f} GiB less per GPU")
fig, ax = plt.subplots(figsize=(6, 3))
plots.plot_bars(ax, speeds, "iterations / s", "gpt2-large on 2 x RTX 3090")"""),
    md("## For real: the offload copies, counted"),
    code("""
from simpar.real.compare import run_real
from simpar.real.cpu_profile import cpu_topology

scenario = make_scenario(model("tiny"), "zero2-offload", 2, topology="cpu-host", precision="fp32")
real, sim = run_real(scenario, steps=2), simulate(scenario, topology=cpu_topology(2))
print("offload bytes per rank and step: measured", [r["offload_bytes"] for r in real["ranks"]],
      "simulated", [r["offload_bytes"] for r in sim.ranks])"""),
    md("""
## Takeaway

Offload is for models that do not fit otherwise: it moves 12Φ/N (Adam + master) off the GPU, but
every step pays PCIe for gradients and parameters and the CPU's optimizer speed. When the model
already fits, turning it on only makes training slower."""),
]

LESSONS["05_pipeline"] = [
    md("""
# Lesson 5 - Pipeline parallelism: GPipe, 1F1B, interleaved

Stages run micro-batches in turn; the pipeline must fill and drain, leaving every stage idle for
a **bubble** of (p−1)/(v·m + p−1) of the step (p stages, m micro-batches, v model chunks per
stage). 1F1B has GPipe's bubble but holds at most p−s micro-batches of activations; interleaving
divides the bubble by v at the cost of v times more point-to-point traffic."""),
    code(SETUP),
    md("## Timelines"),
    code("""
fig, axes = plt.subplots(3, 1, figsize=(12, 9))
for ax, (schedule, v) in zip(axes, [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]):
    scenario = make_scenario(model("gpt2-medium"), "pp", 4, schedule=schedule, virtual_stages=v, microbatches=8,
                             topology="dgx-a100")
    result = simulate(scenario)
    plots.plot_timeline(ax, result.op_timeline, f"{schedule} (v={v}): step {units.human_time(result.step_time_s)}, "
                                                f"bubble {result.breakdown['bubble'] / result.step_time_s:.0%}")
fig.tight_layout()"""),
    md("## The bubble against micro-batches"),
    code("""
ms, series = [4, 8, 16, 32], {}
for schedule, v in [("1f1b", 1), ("interleaved", 2)]:
    fractions = []
    for m_ in ms:
        r = simulate(make_scenario(model("gpt2-medium"), "pp", 4, schedule=schedule, virtual_stages=v, microbatches=m_,
                                   topology="dgx-a100"))
        fractions.append(r.breakdown["bubble"] / r.step_time_s)
    series[f"{schedule} v={v} (simulated)"] = fractions
    series[f"(p-1)/(v m+p-1), v={v}"] = [3 / (v * m_ + 3) for m_ in ms]
fig, ax = plt.subplots(figsize=(7, 4))
plots.plot_series(ax, ms, series, "micro-batches m", "bubble fraction", "p = 4 stages", logx=True)"""),
    md("## Activation memory per stage"),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(12, 3.5), sharey=True)
for ax, schedule in zip(axes, ["gpipe", "1f1b"]):
    r = simulate(make_scenario(model("gpt2-medium"), "pp", 4, schedule=schedule, microbatches=8, topology="dgx-a100"))
    plots.plot_memory_by_rank(ax, r.ranks, f"{schedule}: stage s holds {'m' if schedule == 'gpipe' else 'p - s'} "
                                           "micro-batches")"""),
    md("## For real: a measured 1F1B timeline on 2 CPU ranks"),
    code("""
from simpar.real.compare import run_real

scenario = make_scenario(model("tiny-deep"), "pp", 2, microbatches=4, topology="cpu-host", precision="fp32")
real = run_real(scenario, steps=2)
fig, ax = plt.subplots(figsize=(12, 3))
plots.plot_timeline(ax, real["op_timeline"], "measured 1F1B, 2 gloo ranks (receives include their wait)")"""),
    md("""
## Takeaway

The bubble depends only on p, m and v: more micro-batches per step (or interleaving) shrink it.
GPipe and 1F1B idle equally, but 1F1B frees activations early, so it is the default; interleaving
buys a smaller bubble with more communication."""),
]

LESSONS["06_tensor_parallel"] = [
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

LESSONS["07_calibrate"] = [
    md("""
# Lesson 7 - Calibrate the simulator and read its error

A simulator is worth its calibration. `calibrate` runs micro-benchmarks of this machine (unit
forward/backward, ring steps, optimizer, copies) and fits a profile; `validate` runs whole
strategies for real and compares. Honest evaluation: the fit never sees a whole strategy."""),
    code("""
import matplotlib.pyplot as plt
from simpar import plots, units, validate
from simpar.calibrate import calibrate"""),
    md("## Calibrate (2 ranks, a few repeats: about a minute)"),
    code("""
profile = calibrate(worlds=(2,), repeats=3, progress=print)
fwd = profile.compute["fp32"]["fwd"]
print(f"forward: overhead per layer {fwd[1] * 1e3:.2f} ms, {fwd[-1] / 1e9:.1f} GFLOP/s; "
      f"ring step at 2 ranks: latency {profile.ring['2'][0] * 1e3:.3f} ms, {profile.ring['2'][1] / 1e9:.2f} GB/s")"""),
    md("## Validate on whole strategies the fit never saw"),
    code("""
cases = [validate.run_case(profile, strategy, 2, "fp32", steps=3, timeout=300) for strategy in ["ddp", "zero2", "pp"]]
for c in cases:
    print(f"{c['strategy']:>6} x {c['gpus']}: simulated {units.human_time(c['sim_step_s'])}, "
          f"measured {units.human_time(c['real_step_s'])}, error {c['error']:+.0%}, bytes exact {c['bytes_exact']}")
print(validate.summary(cases))
fig, ax = plt.subplots(figsize=(7, 3.5))
plots.plot_series(ax, [c["strategy"] for c in cases], {"simulated": [c["sim_step_s"] * 1e3 for c in cases],
                                                        "measured": [c["real_step_s"] * 1e3 for c in cases]},
                  "strategy (2 ranks)", "ms per step", "sim vs real")"""),
    md("""
## Reading the error table

Bytes and model-state memory match exactly: they follow from the Plan. Step time depends on the
calibration: on a shared 2-core VM, timings of the same case vary by 2x or more between runs, and
ranks outnumbering cores wait for the scheduler at every message. `simpar validate` over
{ddp, dp, zero1, zero2, zero3, pp, tp} x {2, 4, 8} reports the median and maximum error; the README
lists what we measured and what limits it.

## Takeaway

Trust a simulator's bytes and memory when they are exact; trust its times only as far as a
validation on your machine says, and recalibrate when the machine changes."""),
]


def main() -> None:
    for name, cells in LESSONS.items():
        notebook = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}})
        nbformat.write(notebook, HERE / f"{name}.ipynb")
        print(HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
