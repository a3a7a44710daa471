"""Lesson 2 - Memory of mixed-precision training."""

from lessons.source.cells import SETUP, code, md

CELLS = [
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
