"""The calibration's compute slowdown is measured over seconds of rounds, not one draw of the states
this VM's cores flip between (``burst_worker``)."""

import time

from simpar.calibrate.bench import _together, burst_worker
from simpar.real.launch import launch


def test_the_burst_rounds_run_until_their_seconds_have_passed_and_every_rank_runs_the_same_rounds():
    began = time.perf_counter()
    quick = launch(burst_worker, 2, (1, 3, 0.0), timeout=120)
    assert [r["rounds"] for r in quick] == [3, 3]  # no seconds: the rounds asked for
    timed = launch(burst_worker, 2, (1, 3, 1.5), timeout=120)
    assert timed[0]["rounds"] == timed[1]["rounds"] > 3  # rank 0's clock decided for both
    assert time.perf_counter() - began > 1.5
    for rank in timed:
        assert rank["ratio"] > 0 and rank["together"] > 0 and rank["alone"] > 0 and rank["own"] > 0
    assert timed[0]["own"] == timed[1]["own"]  # each rank's own pace, averaged over the ranks
    assert launch(burst_worker, 1, (1, 3, 1.5), timeout=120)[0].keys() == {"each"}  # alone: nothing shared


def _counts(ctx, seconds: float) -> tuple[int, int]:
    """This rank's agreed count from an own count as far apart as a slow and a fast core's, and the burst's."""
    from simpar.calibrate import bench

    agreed = bench.agreed_count(6 if ctx.rank == 0 else 30)
    seen = []
    real_agreed = bench.agreed_count
    bench.agreed_count = lambda own: seen.append(real_agreed(own)) or seen[-1]
    try:
        bench._short_burst(seconds)
    finally:
        bench.agreed_count = real_agreed
    return agreed, seen[0]


def test_the_short_loops_burst_does_the_same_work_on_every_rank():
    """Each rank timing its own count put one core's state at that moment between the ranks' work (counts of
    15 and 30 for the same 0.8 ms), a skew a step, whose ranks do the same work, does not have."""
    from simpar.calibrate.bench import agreed_count

    ranks = launch(_counts, 2, (3e-4,), timeout=120)
    assert [agreed for agreed, _ in ranks] == [18, 18]  # the mean of 6 and 30
    assert ranks[0][1] == ranks[1][1] >= 1  # the burst's own count, agreed
    assert agreed_count(7) == 7  # no process group: its own


def _uneven(ctx) -> tuple[float, float]:
    """``_together`` of a wait of 1 ms on rank 0 and 6 ms on rank 1."""
    return _together(lambda: time.sleep(1e-3 if ctx.rank == 0 else 6e-3), 4)


def test_together_times_the_slowest_rank_and_each_ranks_own_pace_apart():
    (slowest0, own0), (slowest1, own1) = launch(_uneven, 2, timeout=120)
    assert slowest0 > 5e-3 and slowest1 > 5e-3  # until the slower is done: its 6 ms a call
    assert 1e-3 <= own0 < 3e-3  # the faster rank's own pace, without the wait for the other
    assert own1 >= 6e-3
