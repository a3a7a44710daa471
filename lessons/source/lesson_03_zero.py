"""Lesson 3 - ZeRO stages 1, 2 and 3."""

from lessons.source.cells import SETUP, code, md

CELLS = [
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
    md("""
## Try it: ZeRO stage and N

Pick a model size, a stage and a number of GPUs; the bars are each category's bytes per GPU
(mixed-precision Adam: 2Φ weights, 2Φ gradients, 12Φ optimizer states, each divided by N from its
stage on)."""),
    code("""
from ipywidgets import Dropdown, FloatLogSlider, IntSlider, interact


def per_gpu(billions=7.5, stage="zero2", gpus=64):
    states = model_states(stage, int(billions * 1e9), gpus, TrainSpec(global_batch=gpus, micro_batch=1))
    print(f"{billions:g}B parameters, {stage} on {gpus} GPUs: {units.human_bytes(states.total)} of model states per GPU")
    fig, ax = plt.subplots(figsize=(6, 2.5))
    plots.plot_bars(ax, {"params": states.params / 1e9, "grads": states.grads / 1e9,
                         "optimizer": states.optimizer / 1e9}, "GB per GPU", f"{stage}, N = {gpus}")
    plt.show()


interact(per_gpu, billions=FloatLogSlider(value=7.5, base=10, min=-1, max=3),
         stage=Dropdown(options=["ddp", "zero1", "zero2", "zero3"], value="zero2"),
         gpus=IntSlider(value=64, min=1, max=1024));"""),
    md("## Traffic and time on DGX A100 nodes"),
    code("""
m = model("gpt2-xl")
traffic, step = {}, {}
runs = [("ddp", "ddp", {}), ("zero1", "zero1", {}), ("zero2", "zero2", {}),
        ("zero3 by layer", "zero3", {"gather_granularity": "layer"}),  # the paper's count, FSDP's wrapping
        ("zero3 by module", "zero3", {})]  # DeepSpeed: one all-gather per module (the default)
for label, strategy, options in runs:
    result = simulate(make_scenario(m, strategy, 16, topology="dgx-a100", **options))
    traffic[label] = result.ranks[0]["bytes_sent"] / (2 * m.params)  # in units of the bf16 model
    step[label] = result.step_time_s * 1e3
    print(f"{label:>15}: sends {traffic[label]:.3f} x model bytes per step "
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
1.5x the traffic when whole layers are gathered (the paper's count). DeepSpeed gathers module by
module: a few hundred more, smaller all-gathers per step, each paying its latency; it keeps the head
between its forward and backward (already prefetched) but gathers the tied embedding table again
for the head, so its bytes differ a little from 1.5x. On fast NVSwitch nodes the difference in step time is small; across slower
networks stage 3's extra all-gathers show. The executor moves exactly the simulated bytes."""),
]
