"""The calibration's compute slowdown is measured over seconds of rounds, not one draw of the states
this VM's cores flip between (``burst_worker``)."""

import time

from simpar.calibrate.bench import burst_worker
from simpar.real.launch import launch


def test_the_burst_rounds_run_until_their_seconds_have_passed_and_every_rank_runs_the_same_rounds():
    began = time.perf_counter()
    quick = launch(burst_worker, 2, (1, 3, 0.0), timeout=120)
    assert [r["rounds"] for r in quick] == [3, 3]  # no seconds: the rounds asked for
    timed = launch(burst_worker, 2, (1, 3, 1.5), timeout=120)
    assert timed[0]["rounds"] == timed[1]["rounds"] > 3  # rank 0's clock decided for both
    assert time.perf_counter() - began > 1.5
    for rank in timed:
        assert rank["ratio"] > 0 and rank["together"] > 0 and rank["alone"] > 0
    assert launch(burst_worker, 1, (1, 3, 1.5), timeout=120)[0].keys() == {"each"}  # alone: nothing shared
