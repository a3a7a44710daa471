"""Lesson 5 - Pipeline parallelism: GPipe, 1F1B, interleaved."""

from lessons.source.cells import SETUP, code, md

CELLS = [
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
    md("""
## Try it: micro-batches and stages

The simulated bubble beside (p−1)/(v·m + p−1): slide m up and watch it shrink."""),
    code("""
from ipywidgets import IntSlider, interact


def bubble(stages=4, microbatches=8, virtual_stages=1):
    schedule = "interleaved" if virtual_stages > 1 else "1f1b"
    m_ = microbatches if schedule == "1f1b" else -(-microbatches // stages) * stages  # interleaving: m % p == 0
    r = simulate(make_scenario(model("gpt2-medium"), "pp", stages, schedule=schedule, virtual_stages=virtual_stages,
                               microbatches=m_, topology="dgx-a100"))
    formula = (stages - 1) / (virtual_stages * m_ + stages - 1)
    print(f"p={stages}, m={m_}, v={virtual_stages}: simulated bubble {r.breakdown['bubble'] / r.step_time_s:.1%}, "
          f"formula {formula:.1%}, step {units.human_time(r.step_time_s)}")
    fig, ax = plt.subplots(figsize=(10, 2.5))
    plots.plot_timeline(ax, r.op_timeline, f"{schedule}, p={stages}, m={m_}, v={virtual_stages}")
    plt.show()


interact(bubble, stages=IntSlider(value=4, min=2, max=8), microbatches=IntSlider(value=8, min=1, max=32),
         virtual_stages=IntSlider(value=1, min=1, max=3));"""),
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
