"""The k-rank compute is priced at one rank's rows times how much slower a rank computes beside the others:
where the ranks fit the cores its own pace together over its pace alone, moments apart on the same core, not
the slowest rank's, whose lead the calls after a compute pay (``calibrate.ranks_slowdown``,
``bench.burst_worker``); the rows are timed in visits taken in turns (``compute_bench.compute_worker``)."""

import time
from dataclasses import replace

import simpar.calibrate as calibrate
from simpar.calibrate import bench
from simpar.calibrate.compute_bench import TIMED_PER_VISIT, compute_worker
from simpar.real.launch import launch
from tests.test_validate_retime import _pass, _profile


def test_ranks_that_fit_the_cores_take_their_own_pace_and_more_take_their_paces_averaged():
    burst = {"own_ratio": 0.98, "ranks_own_ratio": 0.9, "ratio": 0.9}
    assert calibrate.ranks_slowdown(burst, 2, cores=2) == 0.98  # either side of 1: not held at the slower
    assert calibrate.ranks_slowdown(burst, 4, cores=2) == 1.0  # time-sliced: below 1 is noise
    # time-sliced: every rank's own pace, not rank 0's alone nor the slowest rank's rounds
    assert calibrate.ranks_slowdown({"own_ratio": 1.9, "ranks_own_ratio": 2.1, "ratio": 2.6}, 4, cores=2) == 2.1
    assert calibrate.ranks_slowdown({"own_ratio": 1.0, "ratio": 2.4}, 4, cores=2) == 2.4  # a burst without it


def _uneven_burst(ctx) -> dict:
    """``burst_worker`` with a unit of 1 ms on rank 0 and 5 ms on rank 1 (a core much slower than the other)."""
    bench._unit_burst = lambda: (lambda: time.sleep(1e-3 if ctx.rank == 0 else 5e-3))
    return bench.burst_worker(ctx, 1, 3, 0.0)


def test_a_slower_peer_does_not_slow_a_ranks_own_compute():
    """The rounds wait for the slower rank (together 5x rank 0's alone); rank 0's own pace is its pace alone, the
    ranks' own paces averaged are (1 + 5) / 2 ms over rank 0's 1 ms alone."""
    burst = launch(_uneven_burst, 2, timeout=120)[0]
    assert burst["ratio"] > 3.5
    assert 0.7 < burst["own_ratio"] < 1.5
    assert burst["own"] > 2e-3  # averaged over the ranks: 1 and 5 ms
    assert 2.2 < burst["ranks_own_ratio"] < 4.0


def test_retimed_keeps_the_calibrated_slowdown():
    profile = replace(_profile(), samples={"shared": {"2": {"burst_together": 1.8e-3}}})
    assert calibrate.retimed(profile, [_pass(1.0), _pass(1.4)], "fp32").slowdown == profile.slowdown


def test_the_compute_pass_visits_every_model_and_batch_in_turns():
    """Every model and batch timed at least ``repeats`` steps, in visits of ``TIMED_PER_VISIT``."""
    rows = launch(compute_worker, 1, (["tiny"], [1, 2], "fp32", 3), timeout=120)[0]
    assert [(r["batch"], r["unit"]) for r in rows] == [(b, u) for b in (1, 2) for u in ("embedding", "layer", "head")]
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 and r["step_s"] > 0 and r["reduce_s"] > 0 for r in rows)
    assert all(r["fwd_gaps"] and r["bwd_gaps"] for r in rows)  # each timed step's gaps since the step before
    assert all(r["cold_concat_s"] > 0 for r in rows)  # the gradients concatenated right after the backward
    assert TIMED_PER_VISIT == 2 and all(r["timed_steps"] == 4 for r in rows)  # two visits of two for 3
