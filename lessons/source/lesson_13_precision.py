"""Lesson 13 - Precision: fp32, bf16 and FP8 on A100, H100 and B200."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 13 - Precision: fp32, bf16 and FP8 on A100, H100 and B200

Each precision changes three things: the bytes a parameter costs (weights, gradients, optimizer
states), the bytes an activation costs, and the rate of the tensor cores the GEMMs run on. FP8
training (Transformer Engine) runs only the transformer layers' linear GEMMs in FP8, with a scale per
tensor; attention, norms, the embedding and the head stay in bf16, and the optimizer keeps fp32
master weights, so FP8 saves time more than memory."""),
    code(SETUP + """
from simpar.cli.fp8_gain import gemm_seconds
from simpar.devices.presets import gpu
from simpar.errors import SimparError

MODEL = model("llama2-7b")
PRECISIONS = ["fp32", "bf16-mixed", "fp8-mixed"]
MACHINES = {"A100": ("dgx-a100", "a100-80gb"), "H100": ("dgx-h100", "h100-sxm"), "B200": ("dgx-b200", "b200")}


def scenario(precision, topology):
    return make_scenario(MODEL, "3d", 8, tp=8, topology=topology, precision=precision, sequence_parallel=True,
                         flash_attention=True, recompute="selective")"""),
    md("## Bytes per parameter and per activation (LLaMA-2-7B, tp 8, one rank)"),
    code("""
for precision in PRECISIONS:
    memory = simulate(scenario(precision, "dgx-h100")).ranks[0]["memory"]
    parts = ", ".join(f"{k} {memory[k] / 2**30:.2f} GiB" for k in ("params", "grads", "optimizer", "activations",
                                                                    "buffers"))
    print(f"{precision:<11} {parts}; peak {memory['peak'] / 2**30:.1f} GiB")"""),
    md("""
bf16-mixed halves the weights and gradients of fp32 but adds an fp32 master copy to the optimizer:
the model states cost about as much. fp8-mixed keeps all of that and adds an FP8 copy of each linear
weight and its transpose (*buffers*), while the linear GEMMs keep their inputs in FP8 (fewer
activation bytes).

## Tensor-core rates and a layer's linear GEMMs"""),
    code("""
rows = {}
for name, (topology, device) in MACHINES.items():
    spec = gpu(device)
    print(f"{name}: fp32 {spec.fp32_flops / 1e12:.0f} T, bf16 {spec.bf16_flops / 1e12:.0f} T, "
          f"FP8 {(spec.fp8_flops or 0) / 1e12:.0f} T dense")
    for precision in PRECISIONS:
        if precision == "fp8-mixed" and spec.fp8_flops is None:
            continue
        linear, layer = gemm_seconds(scenario(precision, topology), spec)
        rows[f"{name} {precision}"] = 1e3 * layer
fig, ax = plt.subplots(figsize=(10, 3.5))
plots.plot_bars(ax, rows, "ms", "one layer, forward and backward, one micro-batch (log scale)")
ax.set_yscale("log")
ax.tick_params(axis="x", rotation=30)"""),
    md("## A training step of each, and where FP8 does not exist"),
    code("""
steps = {}
for name, (topology, _) in MACHINES.items():
    for precision in PRECISIONS[1:]:
        try:
            steps[f"{name} {precision}"] = simulate(scenario(precision, topology)).step_time_s
        except SimparError as error:
            print(f"{name} {precision}: {error}")
for label, seconds in steps.items():
    print(f"{label:<16} step {units.human_time(seconds)}")
fig, ax = plt.subplots(figsize=(8, 3.5))
plots.plot_bars(ax, steps, "s", "LLaMA-2-7B on 8 GPUs, tp 8")"""),
    md("""
## Takeaway

Lower precision buys speed from the tensor cores (each step down doubles the peak) and memory from
activations; the optimizer's fp32 states stay. FP8 speeds up only the linear GEMMs, so the whole step
gains less than 2x: attention, norms, the head and communication keep their bf16 cost, and an
A100 has no FP8 at all."""),
]
