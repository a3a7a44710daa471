"""Fits of the calibration's micro-benchmark results: the collective costs of the step's pattern, the
first call's timed extra, the resume taken off the calls, compute passes averaged, the units' compute."""

import statistics

import numpy as np
import pytest


def test_collective_costs_fit_a_wake_a_step_latency_and_a_bandwidth():
    """A burst, then 1 or 4 calls in a row: the wake is paid once (a collective's and a pipeline
    handoff's their own), every step its latency and bytes."""
    from simpar.calibrate.fits import fit_collective_costs

    rows = [{"op": op, "calls": m, "steps": k, "step_bytes": b,
             "seconds": (1.2e-3 if op == "allgather" else 0.4e-3) + m * k * (300e-6 + b / 2e9)}
            for op, steps in (("allgather", (1, 2)), ("handoff", (1,))) for m in (1, 4) for k in steps
            for b in (2e3, 1.3e5, 1e6)]
    assert fit_collective_costs(rows) == pytest.approx((1.2e-3, 0.4e-3, 300e-6, 2e9, 300e-6))
    collectives = [r for r in rows if r["op"] != "handoff"]  # no handoff measured: its wake is 0, its step the ring's
    assert fit_collective_costs(collectives) == pytest.approx((1.2e-3, 0.0, 300e-6, 2e9, 300e-6))
    below = [dict(r, seconds=r["seconds"] - 1.5e-3) for r in collectives]  # an intercept below zero: fixed at 0
    wake, handoff, alpha, bandwidth, _ = fit_collective_costs(below)
    assert wake == 0.0 == handoff and alpha > 0 and bandwidth > 0


def test_a_measured_wake_is_taken_as_given_and_the_steps_fitted_around_it():
    from simpar.calibrate.fits import fit_collective_costs

    rows = [{"op": "allgather", "calls": m, "steps": k, "step_bytes": b,
             "seconds": 0.2e-3 + m * k * (300e-6 + b / 2e9)} for m in (1, 4) for k in (1, 2) for b in (2e3, 1e6)]
    assert fit_collective_costs(rows, wake=0.2e-3) == pytest.approx((0.2e-3, 0.0, 300e-6, 2e9, 300e-6))
    wake, _, alpha, _, _ = fit_collective_costs(rows, wake=0.0)  # told none: the steps take what the wake was
    assert wake == 0.0 and alpha > 300e-6


def test_series_wake_is_the_first_calls_extra_from_the_ranks_mean_compute_end():
    """Two ranks, two repetitions of a compute then 4 calls (clock times in ms): rank 1 ends computing
    1 ms after rank 0; the first call ends 2.5 ms after their mean end, each next call takes 2 ms: the
    first pays 0.5 ms more (the wait for rank 1). The second repetition pays 1.5 ms more: the mean."""
    from simpar.calibrate.fits import series_wake

    ms = lambda *t: [x * 1e-3 for x in t]
    rank0 = [ms(0, 3, 5, 7, 9), ms(10, 14, 16, 18, 20)]
    rank1 = [ms(1, 3, 5, 7, 9), ms(11, 14, 16, 18, 20)]
    assert series_wake([rank0, rank1]) == pytest.approx(1.0e-3)
    assert series_wake([[ms(0, 1, 3, 5)], [ms(0, 1, 3, 5)]]) == 0.0  # a first call cheaper than the next: 0
    assert series_wake([[], []]) == 0.0


def test_pattern_rows_take_the_resume_off_what_the_calls_cost():
    """Each repetition of the pattern's loop computes once after its calls, and that compute pays the
    resume; the simulator charges the resume to the compute, so the calls' rows must not hold it too."""
    from simpar.calibrate import PATTERN_SIZES, SERIES, pattern_rows
    from simpar.calibrate.bench import PATTERN_OPS

    timings = {f"{op}{size}x{calls}": [calls * 1e-3 + 4e-4, calls * 1e-3 + 5e-4, 9.0]
               for op in PATTERN_OPS for size in PATTERN_SIZES for calls in (1, SERIES)}
    rows = pattern_rows([{"pattern": timings}], 2, resume=5e-4)
    assert len(rows) == len(PATTERN_OPS) * len(PATTERN_SIZES) * 2
    for row in rows:  # the median round (calls ms + 0.5 ms) less the resume
        assert row["seconds"] == pytest.approx(row["calls"] * 1e-3)
    assert all(r["seconds"] == 0.0 for r in pattern_rows([{"pattern": timings}], 2, resume=1.0))  # never below 0
    # a ring all-reduce's steps carry a chunk each, a Worker-Server all-reduce's 2(k - 1) legs the whole buffer
    four = {(r["op"], r["bytes"]): (r["steps"], r["step_bytes"]) for r in pattern_rows([{"pattern": timings}], 4)}
    assert four[("allreduce", 2**21)] == (6, 2**21 / 4) and four[("psreduce", 2**21)] == (6, 2**21)


def test_compute_passes_are_averaged_unit_by_unit():
    """Compute is timed in several passes spread over the calibration (the machine drifts): each unit's
    forward and backward is the median of its passes (of two, their mean)."""
    from simpar.calibrate import average_passes

    row = {"model": "tiny", "batch": 1, "unit": "layer", "fwd_flops": 1.0, "bwd_flops": 2.0}
    passes = [[dict(row, fwd_s=1e-3, bwd_s=2e-3), dict(row, unit="head", fwd_s=5e-4, bwd_s=6e-4)],
              [dict(row, fwd_s=2e-3, bwd_s=4e-3), dict(row, unit="head", fwd_s=7e-4, bwd_s=1e-3)]]
    layer, head = average_passes(passes)
    assert (layer["unit"], layer["fwd_s"], layer["bwd_s"]) == ("layer", pytest.approx(1.5e-3), pytest.approx(3e-3))
    assert (head["fwd_s"], head["bwd_s"]) == (pytest.approx(6e-4), pytest.approx(8e-4))
    assert passes[0][0]["fwd_s"] == 1e-3  # inputs untouched


def test_a_pass_in_a_slow_state_does_not_move_three():
    """Three passes, the second drawn in a slow state (every row 1.5x): each row is the median of its passes,
    the two others' middle, not a mean the slow pass pulls up."""
    from simpar.calibrate import average_passes

    row = {"model": "tiny", "batch": 1, "unit": "layer", "fwd_flops": 1.0, "bwd_flops": 2.0}
    passes = [[dict(row, fwd_s=f, bwd_s=2 * f, step_s=f)] for f in (1.0e-3, 1.5e-3, 1.1e-3)]
    (layer,) = average_passes(passes)
    assert (layer["fwd_s"], layer["bwd_s"], layer["step_s"]) == pytest.approx((1.1e-3, 2.2e-3, 1.1e-3))


def test_the_wake_curve_is_the_rise_of_a_root_and_line_fit_of_each_loops_call():
    """Two ranks, clock times in ms, [compute start, compute end, call end], a loop per length of compute
    (3, 13, 23, 33, 43 ms on average): calls on 4 + 2 sqrt(compute in ms) ms (a random walk's lag), on
    4 + 0.15 compute (a drift: cores at different speeds) and on their sum come back as the fit's rise from
    the first loop exactly (a square root alone fitted on the line over-states its middle); the root's calls
    with the third loop's dipped and the fourth's raised by as much (noise) give a least-squares curve, not the
    points; calls that fall give a flat curve, never below 0."""
    from simpar.calibrate.bench import PHASE_UNITS, phase_cost
    from simpar.calibrate.lag import rise_fit, wake_curve

    ms = lambda *t: [x * 1e-3 for x in t]
    assert len(PHASE_UNITS) == 5 and PHASE_UNITS[0] == 1
    computes = [3.0, 13.0, 23.0, 33.0, 43.0]

    def ranks_with(calls):
        loops = list(enumerate(zip(PHASE_UNITS, calls)))
        ranks = [{"phases": {str(u): [ms(0, end + 10 * i, end + 10 * i + c)] for i, (u, c) in loops}}
                 for end in (2, 4)]
        for r in ranks:  # the Worker-Server all-reduce's loops, kept apart: its own curve (calls half as long)
            r["phases"].update({f"ps{u}": [[m[0], m[1], m[1] + (m[2] - m[1]) / 2] for m in marks]
                                for u, marks in list(r["phases"].items())})
        return ranks

    exact = [4 + 2 * c ** 0.5 for c in computes]
    ranks = ranks_with(exact)
    assert phase_cost([r["phases"]["1"] for r in ranks]) == pytest.approx((3e-3, exact[0] * 1e-3))
    phases, extras, record = wake_curve(ranks)
    assert phases == pytest.approx(ms(*computes))
    rise = [2e-3 * (c ** 0.5 - 3 ** 0.5) for c in computes]  # 2 ms per sqrt(ms) is 2e-3 / sqrt(1e-3) per sqrt(s)
    assert extras == pytest.approx(rise)
    assert record["call_s"] == pytest.approx(ms(*exact))
    assert wake_curve(ranks, "ps")[1] == pytest.approx([e / 2 for e in rise])

    line = [0.15e-3 * (c - 3) for c in computes]
    assert wake_curve(ranks_with([4 + 0.15 * c for c in computes]))[1] == pytest.approx(line, abs=1e-12)
    root_alone = np.polyfit(np.sqrt(computes), [4 + 0.15 * c for c in computes], 1)[0] * (23 ** 0.5 - 3 ** 0.5)
    assert root_alone > 1.1 * 0.15 * 20  # what the square root alone read in the middle: over
    both = wake_curve(ranks_with([a + 0.15 * c for a, c in zip(exact, computes)]))[1]
    assert both == pytest.approx([r + l for r, l in zip(rise, line)], abs=1e-12)

    noisy = [c + d for c, d in zip(exact, [0.0, 0.0, -1.5, 1.5, 0.0])]
    extras = wake_curve(ranks_with(noisy))[1]
    assert extras == pytest.approx(rise_fit(ms(*computes), ms(*noisy)))
    assert extras[2] > 0 and extras != pytest.approx([(n - noisy[0]) * 1e-3 for n in noisy])
    assert all(b >= a for a, b in zip(extras, extras[1:]))  # both terms rise: the curve never falls
    assert wake_curve(ranks_with([10, 9, 8, 7, 6]))[1] == [0.0] * 5


def test_the_rise_fit_is_the_least_squares_fit_over_the_terms_that_come_out_non_negative():
    """Calls that fit the root and line terms best with a negative root (a curve bending up) are fitted on the
    line alone: the result equals the least-squares line's rise, and beats the root alone's squared error."""
    from simpar.calibrate.lag import rise_fit

    x = np.array([1.0, 4.0, 9.0, 16.0, 25.0])
    y = 1.0 + 0.01 * x ** 2  # bends up: the unconstrained fit wants a negative root
    unconstrained = np.linalg.lstsq(np.column_stack([np.ones(5), np.sqrt(x), x]), y, rcond=None)[0]
    assert unconstrained[1] < 0
    slope, intercept = np.polyfit(x, y, 1)
    assert rise_fit(list(x), list(y)) == pytest.approx([slope * (v - x[0]) for v in x])


def test_unit_costs_fit_the_relative_error_so_short_units_are_not_left_one_sided():
    """Timings the line cannot pass through exactly (the long units cost more than the line, as small's do
    on this VM): least squares in seconds lets the long rows set the line and prices the short rows of a
    kind long on average; the fit minimises the relative error instead, so they come out about even."""
    from simpar.calibrate.fits import fit_unit_costs

    rows = []
    for kind, overhead in (("embedding", 150e-6), ("layer", 300e-6), ("head", 200e-6)):
        for f in (1e6, 2e6, 4e6, 2e7, 4e7, 8e7):
            rows.append({"unit": kind, "fwd_flops": f, "fwd_s": (overhead + f / 5e10) * (1.2 if f > 1e7 else 1.0)})
    kinds = {"embedding": 0, "layer": 1, "head": 2}

    def relative(costs):
        return [(costs[kinds[r["unit"]]] + r["fwd_flops"] / costs[3]) / r["fwd_s"] - 1 for r in rows]

    def worst_short_bias(errors):  # the largest mean error of one kind's short rows
        return max(abs(statistics.fmean(e for e, r in zip(errors, rows) if r["unit"] == k and r["fwd_flops"] < 1e7))
                   for k in kinds)

    design = np.array([[r["unit"] == k for k in kinds] + [r["fwd_flops"]] for r in rows], dtype=float)
    plain = np.linalg.lstsq(design, np.array([r["fwd_s"] for r in rows]), rcond=None)[0]
    plain_errors = relative(list(plain[:3]) + [1 / plain[3]])
    errors = relative(fit_unit_costs(rows, "fwd")[0])
    assert worst_short_bias(plain_errors) > 0.04  # the trap: seconds let the long rows decide
    assert worst_short_bias(errors) < 0.02
    assert max(map(abs, errors)) < max(map(abs, plain_errors))
    assert sum(e * e for e in errors) < sum(e * e for e in plain_errors)


def _layer_rows(per_score: float) -> list[dict]:
    """compute_worker's rows of tiny, small and tiny-deep at micro-batches 1, 2, 4: 10-40 us overheads, 20
    GFLOP/s, and ``per_score`` seconds per attention score of a layer (tiny-deep's: twice tiny's, same FLOPs)."""
    from simpar.models import model
    from simpar.scenario import make_scenario
    from simpar.strategies.work import Work

    overheads = {"embedding": 10e-6, "layer": 40e-6, "head": 20e-6}
    rows = []
    for name in ("tiny", "small", "tiny-deep"):
        spec = model(name)
        for b in (1, 2, 4):
            units = Work(make_scenario(spec, "ddp", 1, micro_batch=b, topology="cpu-host")).units
            for kind, u in (("embedding", units[0]), ("layer", units[1]), ("head", units[-1])):
                scores = spec.attention_scores(b) if kind == "layer" else 0
                rows.append({"unit": kind, "fwd_flops": u.fwd_flops, "scores": scores,
                             "fwd_s": overheads[kind] + u.fwd_flops / 2e10 + per_score * scores})
    return rows


def test_a_layers_attention_scores_are_fitted_beside_its_flops():
    """Timings that pay 3 ns an attention score: the fit recovers it, the overheads and the rate; without
    the term (rows that pay nothing for scores) it fits 0."""
    from simpar.calibrate.fits import fit_unit_costs

    costs, extras = fit_unit_costs(_layer_rows(3e-9), "fwd", ("scores",))
    assert costs == pytest.approx([10e-6, 40e-6, 20e-6, 2e10]) and extras["scores"] == pytest.approx(3e-9)
    assert fit_unit_costs(_layer_rows(0.0), "fwd", ("scores",))[1]["scores"] == pytest.approx(0.0, abs=1e-15)


def test_the_simulator_prices_a_layer_by_its_heads_and_tp_splits_them():
    """The same FLOPs in 8 heads or 4: the calibrated cost per score makes the 8-head layer dearer by exactly
    the scores it adds; a TP rank computes 1/tp of the heads, its attention piece pays for them, its MLP
    piece none; full recomputation pays the forward's scores again in the backward."""
    import dataclasses

    from simpar.calibrate.profile import HardwareProfile
    from simpar.models import model
    from simpar.scenario import make_scenario
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    profile = HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                              compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                              ring={"2": [50e-6, 2e9]},
                              optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10,
                              attention_scores={"fp32": [3e-9, 8e-9]})
    deep = model("tiny-deep")

    def layer_costs(spec, strategy="ddp", recompute="none"):
        scenario = make_scenario(spec, strategy, 2, micro_batch=2, topology="cpu-host", recompute=recompute)
        plan = build_plan(scenario)
        costs = OpCosts(plan, scenario, profile.topology(2, "fp32"))
        ops = [op for op in plan.programs[0].ops if getattr(op, "phase", None) in ("fwd", "bwd") and op.unit == 1]
        return {(op.phase, op.part): costs.compute_time(plan.programs[0], op) for op in ops}

    eight, four = layer_costs(deep), layer_costs(dataclasses.replace(deep, heads=4))
    scores = 2 * 4 * 32 ** 2  # micro-batch 2 x the 4 heads more x seq^2
    assert eight[("fwd", "")] - four[("fwd", "")] == pytest.approx(3e-9 * scores)
    assert eight[("bwd", "")] - four[("bwd", "")] == pytest.approx(8e-9 * scores)
    tp, tp_four = layer_costs(deep, "tp"), layer_costs(dataclasses.replace(deep, heads=4), "tp")
    assert tp[("fwd", "attn")] - tp_four[("fwd", "attn")] == pytest.approx(3e-9 * scores / 2)
    assert tp[("fwd", "mlp")] == pytest.approx(tp_four[("fwd", "mlp")])
    recomputed = layer_costs(deep, recompute="full")
    assert recomputed[("bwd", "")] - layer_costs(dataclasses.replace(deep, heads=4), recompute="full")[("bwd", "")] \
        == pytest.approx((3e-9 + 8e-9) * scores)


def test_the_attention_score_term_prices_the_same_on_the_fast_path():
    from simpar.calibrate.profile import HardwareProfile
    from simpar.models import model
    from simpar.scenario import make_scenario
    from simpar.sim import simulate

    profile = HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                              compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                              ring={"2": [50e-6, 2e9]},
                              optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10,
                              attention_scores={"fp32": [3e-9, 8e-9]})
    for strategy in ("ddp", "tp", "pp"):
        scenario = make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, microbatches=4 if strategy == "pp" else 1,
                                 topology="cpu-host")
        full = simulate(scenario, topology=profile.topology(2, "fp32"), replay=False)
        assert simulate(scenario, topology=profile.topology(2, "fp32"), fast=True).step_time_s == pytest.approx(
            full.step_time_s, rel=1e-9)
