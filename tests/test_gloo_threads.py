"""With SIMPAR_GLOO_BATCH=1 gloo's transport threads run at SCHED_BATCH inside the executor's collectives and
nowhere else (simpar/real/gloo_threads.py), in the groups the native collectives make too; by default they are
left as gloo made them; profiles say how they were taken."""

import os

import pytest
import torch
import torch.distributed as dist

from simpar.calibrate.average import average_profiles
from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError
from simpar.real import gloo_threads
from simpar.real.comm import CountingComm, NativeComm
from simpar.real.launch import launch

from test_awake import _profile as awake_profile

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="scheduling policies are Linux's")


def _policies() -> list[int]:
    return [os.sched_getscheduler(tid) for tid in gloo_threads.loop_threads()]


def _seen_in_calls(ctx, native: bool = False) -> dict:
    """The transport threads' policies inside each receive a ring all-reduce (a reduce-scatter, then an
    all-gather) and a pipeline receive make, and before and after them."""
    comm = NativeComm(ctx.rank, [(0, 1)]) if native else CountingComm(ctx.rank)
    seen, receive, reduce = {"inside": []}, dist.recv, dist.all_reduce

    def recording_recv(*args, **kwargs):
        seen["inside"].append(_policies())
        return receive(*args, **kwargs)

    def recording_all_reduce(*args, **kwargs):
        seen["inside"].append(_policies())
        return reduce(*args, **kwargs)

    dist.recv, dist.all_reduce = recording_recv, recording_all_reduce
    try:
        seen["before"] = _policies()
        comm.ring_all_reduce(torch.ones(8), [0, 1])
        seen["after"], seen["inside"] = _policies(), list(seen["inside"])
        peer = 1 - ctx.rank
        if ctx.rank == 0:  # a pipeline's send and receive: not a collective
            comm.isend(torch.ones(4), peer).wait()
        else:
            inside, message = seen["inside"], torch.empty(4)
            seen["inside"] = []
            comm.recv(message, peer)
            seen["pipeline"], seen["inside"] = seen["inside"], inside
    finally:
        dist.recv, dist.all_reduce = receive, reduce
    return seen


def _seen_native(ctx) -> dict:
    return _seen_in_calls(ctx, native=True)


def test_a_collective_runs_with_gloos_transport_threads_at_batch_policy_and_nothing_else(monkeypatch):
    monkeypatch.setenv(gloo_threads.ENV, "1")  # the spawned ranks inherit the environment
    for seen in launch(_seen_in_calls, 2, timeout=60):
        assert seen["before"] == seen["after"] == [os.SCHED_OTHER]  # one transport thread, ordinary outside
        assert seen["inside"] and all(policies == [os.SCHED_BATCH] for policies in seen["inside"])
        assert seen.get("pipeline", [[os.SCHED_OTHER]]) == [[os.SCHED_OTHER]]  # rank 1's receive
    for seen in launch(_seen_native, 2, timeout=60):  # the group native collectives make has its own thread
        assert seen["inside"] and all(policies == [os.SCHED_BATCH] * 2 for policies in seen["inside"])
        assert seen["after"] == [os.SCHED_OTHER] * 2


def test_the_threads_are_left_as_gloo_made_them_by_default(monkeypatch):
    monkeypatch.delenv(gloo_threads.ENV, raising=False)
    assert not gloo_threads.enabled()
    for seen in launch(_seen_in_calls, 2, timeout=60):
        assert seen["inside"] and all(policies == [os.SCHED_OTHER] for policies in seen["inside"])


def test_nothing_is_set_outside_a_gloo_group(monkeypatch):
    monkeypatch.setenv(gloo_threads.ENV, "1")
    assert not dist.is_initialized()
    assert gloo_threads.loop_threads() == [] and gloo_threads.refresh() == []
    assert gloo_threads.in_batch(lambda x: x + 1)(1) == 2  # runs the call, sets nothing


def _profile(gloo_batch: bool | None) -> HardwareProfile:
    return awake_profile(True, gloo_batch)  # kept awake, as every profile since the spinners


def test_a_profile_taken_with_the_threads_the_other_way_is_named_and_not_averaged(monkeypatch):
    from simpar.real import awake

    monkeypatch.delenv(awake.ENV, raising=False)
    monkeypatch.setenv(gloo_threads.ENV, "1")
    assert _profile(True).awake_mismatch() == ""
    for older in (_profile(False), _profile(None)):  # a profile from before: its calls paid the spin
        assert ("calibrated without gloo's transport threads at SCHED_BATCH, the ranks now run with"
                in older.awake_mismatch())
    monkeypatch.delenv(gloo_threads.ENV)  # the default: the threads as gloo made them
    assert _profile(None).awake_mismatch() == "" == _profile(False).awake_mismatch()
    assert "SIMPAR_GLOO_BATCH" in _profile(True).awake_mismatch()
    with pytest.raises(SimparError, match="--average: b.json and a.json were calibrated one with gloo's transport "
                                          "threads at SCHED_BATCH, one without"):
        average_profiles([_profile(True), _profile(False)], ["a.json", "b.json"])
