"""gloo's transport threads run at SCHED_BATCH in every rank simpar launches (simpar/real/gloo_threads.py), in
the groups the native collectives make too, unless SIMPAR_GLOO_BATCH=0; profiles say how they were taken."""

import os

import pytest
import torch.distributed as dist

from simpar.calibrate.average import average_profiles
from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError
from simpar.real import gloo_threads
from simpar.real.comm import NativeComm
from simpar.real.launch import launch

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="scheduling policies are Linux's")


def _policies(ctx) -> list[int]:
    return [os.sched_getscheduler(tid) for tid in gloo_threads.loop_threads()]


def _policies_with_groups(ctx) -> list[int]:
    NativeComm(ctx.rank, [(0, 1)])  # a new gloo group: its own transport thread
    return _policies(ctx)


def test_launched_ranks_run_gloos_transport_threads_at_batch_policy(monkeypatch):
    monkeypatch.delenv(gloo_threads.ENV, raising=False)
    seen = launch(_policies, 2, timeout=60)
    assert seen == [[os.SCHED_BATCH]] * 2  # one transport thread per process group, set
    with_groups = launch(_policies_with_groups, 2, timeout=60)
    assert all(len(policies) == 2 and set(policies) == {os.SCHED_BATCH} for policies in with_groups)


def test_the_threads_are_left_as_gloo_made_them_when_told(monkeypatch):
    monkeypatch.setenv(gloo_threads.ENV, "0")  # the spawned ranks inherit the environment
    assert not gloo_threads.enabled()
    assert launch(_policies, 2, timeout=60) == [[os.SCHED_OTHER]] * 2


def test_nothing_is_set_outside_a_gloo_group(monkeypatch):
    monkeypatch.delenv(gloo_threads.ENV, raising=False)
    assert not dist.is_initialized()
    assert gloo_threads.loop_threads() == [] and gloo_threads.batch_loop_threads() == 0


def _profile(gloo_batch: bool | None) -> HardwareProfile:
    machine = {"host": "vm", "cores": 2, "kept_awake": True} | ({} if gloo_batch is None else {"gloo_batch": gloo_batch})
    return HardwareProfile(machine=machine, compute={"fp32": {"fwd": [1e-4] * 3 + [1e10], "bwd": [2e-4] * 3 + [1e10]}},
                           slowdown={"1": 1.0, "2": 1.2}, ring={"2": [1e-3, 1e9]},
                           optimizer_params_per_s={"adam": 1e8}, copy_bytes_per_s=1e10)


def test_a_profile_taken_with_the_threads_the_other_way_is_named_and_not_averaged(monkeypatch):
    from simpar.real import awake

    monkeypatch.delenv(awake.ENV, raising=False)
    monkeypatch.delenv(gloo_threads.ENV, raising=False)
    assert _profile(True).awake_mismatch() == ""
    for older in (_profile(False), _profile(None)):  # a profile from before: its calls paid the spin
        assert ("calibrated without gloo's transport threads at SCHED_BATCH, the ranks now run with"
                in older.awake_mismatch())
    monkeypatch.setenv(gloo_threads.ENV, "0")
    assert _profile(None).awake_mismatch() == ""
    assert "SIMPAR_GLOO_BATCH" in _profile(True).awake_mismatch()
    with pytest.raises(SimparError, match="--average: b.json and a.json were calibrated one with gloo's transport "
                                          "threads at SCHED_BATCH, one without"):
        average_profiles([_profile(True), _profile(False)], ["a.json", "b.json"])
