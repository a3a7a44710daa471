"""Lesson 4 - ZeRO-Offload and ZeRO-Infinity."""

from lessons.source.cells import SETUP, code, md

CELLS = [
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
