"""Lesson 7 - Calibrate the simulator and read its error."""

from lessons.source.cells import code, md

CELLS = [
    md("""
# Lesson 7 - Calibrate the simulator and read its error

A simulator is worth its calibration. `calibrate` runs micro-benchmarks of this machine (unit
forward/backward, ring steps, calls after computes, pipeline messages, the optimizer) and fits a
profile: a base (compute as overhead + FLOPs / rate, cores shared in proportion, a ring step's latency
and bandwidth) and twelve terms, each a cost the executor's ranks pay that the base does not see
(docs/calibration.md has the table, and what each one is worth); `validate` runs whole strategies for
real and compares. Honest evaluation: the fit never sees a whole strategy."""),
    code("""
import matplotlib.pyplot as plt
from simpar import plots, units, validate
from simpar.calibrate import calibrate"""),
    md("## Calibrate (quick: 2 ranks, two models, two rounds; about 15 seconds)"),
    code("""
profile = calibrate(worlds=(2,), quick=True, progress=print)
fwd = profile.compute["fp32"]["fwd"]
print(f"forward: overhead per layer {fwd[1] * 1e3:.2f} ms, {fwd[-1] / 1e9:.1f} GFLOP/s; "
      f"ring step at 2 ranks: latency {profile.ring['2'][0] * 1e3:.3f} ms, {profile.ring['2'][1] / 1e9:.2f} GB/s")"""),
    md("## Validate on whole strategies the fit never saw"),
    code("""
cases = validate.run_cases(profile, [(strategy, 2) for strategy in ["ddp", "zero2", "pp"]], "fp32", steps=3, timeout=300)
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
calibration and on the machine's noise: on a shared 2-core VM identical runs minutes apart differ by
10-30 %, and ranks outnumbering cores wait for the scheduler at every message. `simpar validate
--repeats 3` over {ddp, dp, zero1, zero2, zero3, pp, tp} x {2, 4, 8} reports the median and maximum
error beside the runs' spread, and `simpar/referee.py` says how close any model could come in the
same window; the README lists what we measured.

## Takeaway

Trust a simulator's bytes and memory when they are exact; trust its times only as far as a
validation on your machine says, and recalibrate when the machine changes."""),
]
