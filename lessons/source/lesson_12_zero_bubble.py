"""Lesson 12 - Zero-bubble pipelines: splitting the backward into B and W."""

from lessons.source.cells import SETUP, code, md

CELLS = [
    md("""
# Lesson 12 - Zero-bubble pipelines: ZB-H1 and ZB-V

A layer's backward does two things: the gradient of its **input** (B), which the previous stage is
waiting for, and the gradient of its **weights** (W), which nobody waits for until the optimizer step.
Qi et al. (2023, "Zero Bubble Pipeline Parallelism") split them and schedule W into the bubbles:

* **ZB-H1** keeps 1F1B's warm-up and its peak memory; stage s defers s W passes and runs them where
  1F1B would idle. Each stage idles (p−1)(T_F + T_B − T_W) instead of (p−1)(T_F + T_B + T_W): a third
  of it when the three passes take equally long.
* **ZB-V** gives each stage two model chunks in a V (stage s holds chunks s and 2p−1−s, so the first and
  last stage are the same GPU) and fills the pipeline from both ends: at m ≥ 2p the bubble nearly vanishes
  when F, B and W take equally long.

(Here T_B is the input-gradient pass alone; 1F1B's backward is B + W.)"""),
    code(SETUP + """
from simpar.strategies import build_plan

MODEL = model("llama2-7b")
SCHEDULES = ["gpipe", "1f1b", "zb-h1", "zb-v"]


def pipeline(schedule, microbatches=8, **options):
    scenario = make_scenario(MODEL, "pp", 4, schedule=schedule, microbatches=microbatches, flash_attention=True,
                             **options)
    return scenario, simulate(scenario)"""),
    md("## Timelines side by side (LLaMA-2-7B, 4 stages, 8 micro-batches; W drawn apart from B)"),
    code("""
fig, axes = plt.subplots(4, 1, figsize=(12, 12), sharex=True)
for ax, schedule in zip(axes, SCHEDULES):
    scenario, result = pipeline(schedule)
    timeline = plots.split_weight_grads(result.op_timeline, build_plan(scenario))
    plots.plot_timeline(ax, timeline, f"{schedule}: step {units.human_time(result.step_time_s)}, "
                                      f"bubble {result.breakdown['bubble'] / result.step_time_s:.0%}")
fig.tight_layout()"""),
    md("""
## The bubble formula, checked on the timeline

T_F, T_B and T_W are a micro-batch's forward, input-gradient and weight-gradient passes on a middle stage;
the idle time of the last stage (which waits for nobody downstream) is set beside the formulas. The last
stage also computes the LM head, so its own passes are a little longer than the middle stage's."""),
    code("""
def passes(result, scenario, stage, m=8):
    \"\"\"Per micro-batch compute time of each class on ``stage``, and the stage's idle time.\"\"\"
    timeline = plots.split_weight_grads(result.op_timeline, build_plan(scenario))
    ops = next(p["ops"] for p in timeline if stage in p["ranks"])
    busy = {}
    for entry in ops:
        if entry["stream"] == "compute":
            busy[entry["class"]] = busy.get(entry["class"], 0.0) + entry["end"] - entry["start"]
    return {k: v / m for k, v in busy.items()}, result.step_time_s - sum(busy.values())


p = 4
for schedule in ("1f1b", "zb-h1"):
    scenario, result = pipeline(schedule)
    times, _ = passes(result, scenario, stage=1)
    _, idle = passes(result, scenario, stage=p - 1)
    t_f, t_b, t_w = times["forward"], times["backward"], times.get(plots.WEIGHT_GRADS, 0.0)
    if schedule == "1f1b":  # 1F1B's backward is B + W in one pass
        formula, name = (p - 1) * (t_f + t_b), "(p-1)(T_F + T_B + T_W)"
    else:
        formula, name = (p - 1) * (t_f + t_b - t_w), "(p-1)(T_F + T_B - T_W)"
    print(f"{schedule:<6} T_F {t_f * 1e3:.1f} ms, backward {t_b * 1e3:.1f} ms, W {t_w * 1e3:.1f} ms: last stage idles "
          f"{idle * 1e3:.0f} ms, {name} = {formula * 1e3:.0f} ms")"""),
    md("## The bubble against micro-batches"),
    code("""
ms, series = [8, 16, 32], {}
for schedule in SCHEDULES[1:]:
    results = [pipeline(schedule, m_)[1] for m_ in ms]
    series[schedule] = [r.breakdown["bubble"] / r.step_time_s for r in results]
series["(p-1)/(m+p-1)"] = [3 / (m_ + 3) for m_ in ms]
fig, ax = plt.subplots(figsize=(7, 4))
plots.plot_series(ax, ms, series, "micro-batches m", "bubble fraction of the step", "p = 4 stages", logx=True)"""),
    md("""
ZB-V's remaining bubble here comes from unequal passes (B is longer than W, attention has no W at
all) and from the stage that holds the embedding and the head: at equal F, B and W times it is within
half a forward of zero (tests/test_zero_bubble.py).

## Memory per stage

1F1B's stage s holds p − s micro-batches of activations. ZB-H1 holds the same activations, and on top
the inputs and output gradients its deferred W passes still need ("temporaries"): the later stages,
which defer more W passes, rise to stage 0's level, so the *peak* over stages is 1F1B's. ZB-V holds
about p micro-batches' worth on every stage."""),
    code("""
fig, axes = plt.subplots(1, 3, figsize=(15, 3.5), sharey=True)
for ax, schedule in zip(axes, ("1f1b", "zb-h1", "zb-v")):
    _, result = pipeline(schedule)
    peak = max(r["memory"]["peak"] for r in result.ranks) / 2**30
    plots.plot_memory_by_rank(ax, result.ranks, f"{schedule}: peak {peak:.1f} GiB")"""),
    md("## Measured: a ZB-H1 step performed by the executor on 2 CPU ranks"),
    code("""
from simpar.real.compare import run_real

scenario = make_scenario(model("tiny-deep"), "pp", 2, schedule="zb-h1", microbatches=4, topology="cpu-host",
                         precision="fp32")
real = run_real(scenario, steps=2)
fig, ax = plt.subplots(figsize=(12, 3))
plots.plot_timeline(ax, plots.split_weight_grads(real["op_timeline"], build_plan(scenario)),
                    "measured ZB-H1, 2 gloo ranks (weight gradients computed apart, after the input gradients)")
print("losses", [round(x, 4) for x in real["losses"]])"""),
    md("""
## Takeaway

Autograd computes input and weight gradients separately, and only the input gradient is on the
pipeline's critical path. Deferring W fills the bubble: ZB-H1 cuts it from (p−1)(T_F+T_B+T_W) to
(p−1)(T_F+T_B−T_W) at 1F1B's peak memory; ZB-V's V-shaped placement nearly removes it for about p
micro-batches of activations on every stage. The cost is the memory a deferred W keeps alive."""),
]
