"""A pipeline send's hold drawn from its measured spread (simpar/spread.py): the spread's shape, the draw at a
probability, the price of a Plan with pipeline sends as the mean of its seeded draws (held to the explicit loop
of single draws), and the cases that draw nothing."""

import numpy as np
import pytest

from simpar.calibrate.average import average_profiles
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import build_topology, simulate, simulate_once
from simpar.sim.runner import Simulator
from simpar.spread import DRAWS, SPREAD_POINTS, draws_for, factor, spread_of
from simpar.strategies import build_plan
from tests.test_tensor_work import _profile

# a tick now and then: nine samples in ten at 0.1 ms, one at 4 ms (the shape of the calibration's isends)
STALLS = [1e-4] * 90 + [4e-3] * 10


def _mean_of(spread: list[float]) -> float:
    return float(np.trapezoid(spread, dx=1.0 / (len(spread) - 1)))


def _pipeline_profile(spread: list[float] | None = None, world: int = 2):
    """A profile with a pipeline message's costs (isend hold, late receive) at ``world`` and 2 ranks and,
    unless None, ``spread`` for the isend's hold."""
    keys = sorted({"2", str(world)})
    profile = _profile(send_issue={k: 3e-4 for k in keys}, late_recv={k: 1.2e-3 for k in keys})
    profile.slowdown, profile.ring = {"1": 1.0, "2": 1.0, "4": 2.1}, {k: [50e-6, 2e9] for k in keys}
    if spread is not None:
        profile.send_issue_spread = {k: spread for k in keys}
    return profile


def _pp(world: int = 2):
    return make_scenario(model("tiny-deep"), "pp", world, micro_batch=2, microbatches=2 * world, precision="fp32",
                         topology="cpu-host")


def test_a_spread_is_the_quantile_function_over_the_mean_with_mean_one():
    spread = spread_of(STALLS)
    assert len(spread) == SPREAD_POINTS
    assert spread == sorted(spread)  # a quantile function
    assert _mean_of(spread) == pytest.approx(1.0, rel=1e-12)
    mean = np.mean(STALLS)
    assert spread[0] / spread[SPREAD_POINTS // 2] == pytest.approx(1.0)  # the median is the fast case
    assert spread[-1] / spread[0] == pytest.approx(4e-3 / 1e-4)  # the largest sample over the smallest
    assert spread[0] == pytest.approx(1e-4 / mean, rel=0.05)  # rescaled to mean 1: by 3 % here, 1 % on real samples
    assert spread_of([2e-3] * 5) == pytest.approx([1.0] * SPREAD_POINTS)  # no spread: the mean every time
    assert spread_of([1e-3]) == [] and spread_of([]) == [] and spread_of([0.0, 0.0]) == []


def test_a_draw_reads_the_spread_at_its_probability_between_the_worlds_measured():
    low, high = spread_of(STALLS), spread_of([1e-3, 2e-3, 3e-3])
    spreads = {2: low, 4: high}
    assert factor(spreads, 2, 0.0) == pytest.approx(low[0]) and factor(spreads, 2, 1.0) == pytest.approx(low[-1])
    assert factor(spreads, 4, 0.5) == pytest.approx(high[SPREAD_POINTS // 2])
    for u in (0.0, 0.31, 0.97, 1.0):  # between worlds, interpolated; beyond them, held
        assert factor(spreads, 3, u) == pytest.approx((factor(spreads, 2, u) + factor(spreads, 4, u)) / 2)
        assert factor(spreads, 8, u) == factor(spreads, 4, u) and factor(spreads, 1, u) == factor(spreads, 2, u)
    grid = np.linspace(0.0, 1.0, SPREAD_POINTS)  # at any ranks the draws keep the mean
    for runnable in (2, 3, 4):
        assert _mean_of([factor(spreads, runnable, u) for u in grid]) == pytest.approx(1.0, rel=1e-12)
    assert factor(None, 3, 0.9) == 1.0 and factor({}, 3, 0.9) == 1.0


def test_the_topology_prices_a_draw_as_the_mean_times_the_spread_there_and_a_late_receive_at_its_mean():
    spread = spread_of(STALLS)
    topology = _pipeline_profile(spread, world=4).topology(4, "fp32")
    for runnable in (2, 3, 4):
        mean_issue, mean_late = topology.send_issue(runnable), topology.late_recv(runnable)
        assert mean_issue == pytest.approx(3e-4) and mean_late == pytest.approx(1.2e-3)
        for u in (0.0, 0.5, 0.99):
            assert topology.send_issue(runnable, u) == pytest.approx(mean_issue * factor({2: spread}, 2, u))
    plain = _pipeline_profile(None).topology(2, "fp32")  # no spread measured: a draw is the mean
    assert plain.send_issue(2, 0.99) == plain.send_issue(2)


@pytest.mark.parametrize("world", [2, 4])
def test_the_price_is_the_mean_of_the_seeded_draws(world):
    scenario, profile = _pp(world), _pipeline_profile(spread_of(STALLS), world)
    topology, plan = profile.topology(world, "fp32"), build_plan(_pp(world))
    assert draws_for(topology, plan, serial=True) == DRAWS
    assert draws_for(topology, plan, serial=False) == 0  # streams overlapping: a send holds nothing to draw
    drawn = simulate(scenario, topology=topology, serial=True)
    singles = [Simulator(plan, scenario, profile.topology(world, "fp32"), serial=True, draw=i).run()
               for i in range(DRAWS)]
    assert drawn.step_time_s == pytest.approx(sum(singles) / DRAWS, rel=1e-12)
    assert drawn.draw_steps == singles  # each draw's step kept beside their mean
    assert len(set(singles)) > 1  # the draws differ
    assert simulate(scenario, topology=topology, serial=True).step_time_s == drawn.step_time_s  # seeded
    # the parts, overall and each rank's, are the means of the draws' parts
    each = [simulate_once(scenario, topology, plan, serial=True, draw=i) for i in range(DRAWS)]
    assert [r.step_time_s for r in each] == singles
    for part, seconds in drawn.breakdown.items():
        assert seconds == pytest.approx(sum(r.breakdown[part] for r in each) / DRAWS, rel=1e-12, abs=1e-15)
    for i, rank in enumerate(drawn.ranks):
        for part, seconds in rank["op_time"].items():
            assert seconds == pytest.approx(sum(r.ranks[i]["op_time"][part] for r in each) / DRAWS, rel=1e-12,
                                            abs=1e-15)
    assert any(f"mean of {DRAWS} draws" in note for note in drawn.notes)
    at_means = simulate(scenario, topology=topology, serial=True, draws=0)
    assert at_means.step_time_s == Simulator(plan, scenario, topology, serial=True).run()
    assert [r["bytes_sent"] for r in at_means.ranks] == [r["bytes_sent"] for r in drawn.ranks]
    assert [r["memory"] for r in at_means.ranks] == [r["memory"] for r in drawn.ranks]
    # fewer draws: the mean of the first ones
    assert simulate(scenario, topology=topology, serial=True, draws=4).step_time_s == \
        pytest.approx(sum(singles[:4]) / 4, rel=1e-12)


def test_a_spread_of_ones_prices_as_the_means_do():
    scenario = _pp(2)
    flat = simulate(scenario, topology=_pipeline_profile([1.0] * SPREAD_POINTS).topology(2, "fp32"), serial=True)
    means = simulate(scenario, topology=_pipeline_profile(None).topology(2, "fp32"), serial=True)
    assert flat.step_time_s == pytest.approx(means.step_time_s, rel=1e-12)


def test_nothing_is_drawn_without_pipeline_sends_a_spread_shared_cores_or_the_executors_order():
    spread = spread_of(STALLS)
    ddp = make_scenario(model("tiny-deep"), "ddp", 2, micro_batch=2, precision="fp32", topology="cpu-host")
    topology = _pipeline_profile(spread).topology(2, "fp32")
    assert draws_for(topology, build_plan(ddp), True) == 0
    assert not any("draws" in note for note in simulate(ddp, topology=topology, serial=True).notes)
    assert draws_for(_pipeline_profile(None).topology(2, "fp32"), build_plan(_pp()), True) == 0
    overlapping = simulate(_pp(), topology=topology, serial=False)
    assert not any("draws" in note for note in overlapping.notes)
    assert overlapping.step_time_s == simulate(_pp(), topology=topology, serial=False, draws=0).step_time_s
    gpus = make_scenario(model("tiny-deep"), "pp", 2, micro_batch=2, microbatches=4, precision="fp32")
    assert draws_for(build_topology(gpus), build_plan(gpus), True) == 0


def test_averaged_profiles_average_the_spreads_point_by_point():
    first, second = _pipeline_profile(spread_of(STALLS)), _pipeline_profile(spread_of([1e-3, 2e-3, 3e-3]))
    averaged = average_profiles([first, second], ["a", "b"])
    expected = [(a + b) / 2 for a, b in zip(first.send_issue_spread["2"], second.send_issue_spread["2"])]
    assert averaged.send_issue_spread["2"] == pytest.approx(expected)
    assert _mean_of(averaged.send_issue_spread["2"]) == pytest.approx(1.0, rel=1e-12)
    older = _pipeline_profile(None)  # calibrated before spreads were measured: averaged over those that have one
    assert average_profiles([first, older], ["a", "b"]).send_issue_spread == first.send_issue_spread


def test_the_benchmark_sets_the_price_at_the_means_beside_the_drawn_one():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "pipeline_spread", Path(__file__).parents[1] / "benchmarks" / "pipeline_spread.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    profile = _pipeline_profile(spread_of(STALLS))
    scenario = bench.case_scenario("pp", 2, "fp32")
    at_means, drawn, sd = bench.prices(profile, 2)
    topology = profile.topology(2, "fp32")
    assert at_means == simulate(scenario, topology=topology, serial=True, draws=0).step_time_s
    assert drawn == pytest.approx(simulate(scenario, topology=topology, serial=True).step_time_s, rel=1e-12)
    assert sd > 0


def test_only_the_sends_hold_is_drawn_a_late_receive_stays_at_its_mean():
    """With the holds at nothing the draws change nothing, though the late receives (1.2 ms) are there."""
    profile = _pipeline_profile(spread_of(STALLS))
    profile.send_issue = {"2": 0.0}
    topology = profile.topology(2, "fp32")
    drawn = simulate(_pp(), topology=topology, serial=True)
    assert any("draws" in note for note in drawn.notes)
    assert drawn.step_time_s == pytest.approx(simulate(_pp(), topology=topology, serial=True, draws=0).step_time_s,
                                              rel=1e-12)
    assert drawn.step_time_s > simulate(_pp(), topology=_profile().topology(2, "fp32"), serial=True).step_time_s
