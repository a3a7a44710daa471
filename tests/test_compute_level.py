"""The k-rank compute is priced at the level k ranks met computing at once over seconds of rounds
(``burst_worker``), set against the one-rank rows' own time of the burst's unit (``ranks_slowdown``);
the rows are timed in visits taken in turns (``compute_bench.compute_worker``)."""

from dataclasses import replace

import pytest

import simpar.calibrate as calibrate
from simpar.calibrate.bench import BURST_UNIT
from simpar.calibrate.compute_bench import TIMED_PER_VISIT, compute_worker, level_slowdowns, ranks_slowdown
from simpar.real.launch import launch
from tests.test_validate_retime import _pass, _profile


def _rows(scale: float = 1.0) -> list[dict]:
    """``_pass``'s rows, with the burst's model among them (its layer forward + backward: 1.2 ms x scale)."""
    name, batch = BURST_UNIT
    burst = {"model": name, "batch": batch, "unit": "layer", "fwd_flops": 8e6, "bwd_flops": 16e6,
             "fwd_s": 0.4e-3 * scale, "bwd_s": 0.8e-3 * scale, "between_ops_s": 30e-6 * scale}
    return _pass(scale) + [burst]


def test_the_slowdown_is_the_ranks_burst_over_the_rows_own_time_of_its_unit():
    assert ranks_slowdown(1.8e-3, _rows()) == pytest.approx(1.5)
    # the rows drawn in a slow state: the same ranks' level, a smaller factor on the slower rows
    assert ranks_slowdown(1.8e-3, _rows(1.2)) == pytest.approx(1.25)
    # the rounds met a faster state than the rows' pass: priced at the rounds' level, not held at the rows'
    assert ranks_slowdown(1e-3, _rows()) == pytest.approx(1 / 1.2)


def test_the_priced_k_rank_compute_follows_the_ranks_level_not_the_rows_pass():
    """Rows of a pass drawn 1.5x slow price every k-rank unit as the fast pass's rows do."""
    together = 1.8e-3
    for fast, slow in zip(_rows(1.0), _rows(1.5)):
        assert (fast["fwd_s"] + fast["bwd_s"]) * ranks_slowdown(together, _rows(1.0)) == pytest.approx(
            (slow["fwd_s"] + slow["bwd_s"]) * ranks_slowdown(together, _rows(1.5)))


def test_only_worlds_whose_ranks_fit_the_cores_take_the_level():
    """Where ranks outnumber the cores the rounds are time-sliced: those keep the rounds' own ratio."""
    shared = {"2": {"burst_together": 1.8e-3}, "4": {"burst_together": 6e-3}, "8": {}}
    assert level_slowdowns(shared, _rows(), cores=2) == {"2": pytest.approx(1.5)}
    assert level_slowdowns(shared, _rows(), cores=4) == {"2": pytest.approx(1.5), "4": pytest.approx(5.0)}
    assert level_slowdowns(shared, _pass(1.0), cores=4) == {}  # rows without the burst's unit


def test_the_level_is_each_ranks_own_pace_not_the_slowest_ranks():
    """The slowest rank's lead is paid by the calls after a compute (``wake_curve``); counted in the compute
    too, it was paid twice. A profile from before ``burst_own`` keeps the slowest's."""
    shared = {"2": {"burst_together": 1.8e-3, "burst_own": 1.2e-3}, "4": {"burst_together": 1.5e-3}}
    assert level_slowdowns(shared, _rows(), cores=4) == {"2": pytest.approx(1.0), "4": pytest.approx(1.25)}


def test_retimed_sets_the_slowdown_against_its_own_passes():
    profile = replace(_profile(), samples={"shared": {"2": {"burst_together": 1.8e-3}}})
    fresh = calibrate.retimed(profile, [_rows(1.0), _rows(1.4)], "fp32")
    assert fresh.slowdown == {"1": 1.0, "2": pytest.approx(1.8 / (1.2 * 1.2))}  # the passes' mean unit: 1.2x
    # rows without the burst's unit, or a profile without the rounds: as calibrated
    assert calibrate.retimed(profile, [_pass(1.0)], "fp32").slowdown == profile.slowdown
    assert calibrate.retimed(_profile(), [_rows(1.0)], "fp32").slowdown == _profile().slowdown


def test_the_compute_pass_visits_every_model_and_batch_in_turns():
    """Every model and batch timed at least ``repeats`` steps, in visits of ``TIMED_PER_VISIT``."""
    rows = launch(compute_worker, 1, (["tiny"], [1, 2], "fp32", 3), timeout=120)[0]
    assert [(r["batch"], r["unit"]) for r in rows] == [(b, u) for b in (1, 2) for u in ("embedding", "layer", "head")]
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 and r["step_s"] > 0 and r["reduce_s"] > 0 for r in rows)
    assert all(r["fwd_gaps"] and r["bwd_gaps"] for r in rows)  # each timed step's gaps since the step before
    assert TIMED_PER_VISIT == 2 and all(r["timed_steps"] == 4 for r in rows)  # two visits of two for 3
