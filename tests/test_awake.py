"""The spinners that keep the cores awake while gloo ranks run (simpar/real/awake.py): one per core, idle
priority, pinned, gone when the run is, and even when simpar is killed; profiles say how they were taken."""

import os
import signal
import subprocess
import sys
import time

import pytest

from simpar.calibrate.average import average_profiles
from simpar.calibrate.profile import HardwareProfile
from simpar.errors import SimparError
from simpar.real import awake
from simpar.real.launch import launch

from rank_processes import descendants


def _spinners_of(pid: int) -> set[int]:
    found = set()
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as handle:
                if b"SCHED_IDLE" in handle.read():  # the spinner's code is on its command line
                    found.add(child)
        except OSError:
            continue
    return found


def _wait_for(condition, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _settled(pid: int, core: int) -> bool:
    try:
        return os.sched_getscheduler(pid) == os.SCHED_IDLE and os.sched_getaffinity(pid) == {core}
    except OSError:
        return False


def test_one_idle_priority_spinner_per_core_for_the_body_and_none_after(monkeypatch):
    monkeypatch.delenv(awake.ENV, raising=False)
    cores = sorted(os.sched_getaffinity(0))
    with awake.cores_kept_awake() as spinners:
        assert len(spinners) == len(cores)
        for spinner, core in zip(spinners, cores):
            assert _wait_for(lambda: _settled(spinner.pid, core)), f"spinner for core {core} never went idle"
        assert _spinners_of(os.getpid()) == {s.pid for s in spinners}
    assert all(s.poll() is not None for s in spinners)
    assert _spinners_of(os.getpid()) == set()


def test_no_spinner_when_switched_off_or_not_asked(monkeypatch):
    monkeypatch.setenv(awake.ENV, "0")
    assert not awake.enabled()
    with awake.cores_kept_awake() as spinners:
        assert spinners == [] and _spinners_of(os.getpid()) == set()
    monkeypatch.delenv(awake.ENV)
    with awake.cores_kept_awake(active=False) as spinners:
        assert spinners == []


def test_the_spinners_die_with_a_killed_simpar():
    script = ("import sys, time\nfrom simpar.real.awake import cores_kept_awake\n"
              "with cores_kept_awake() as s:\n    print(*[p.pid for p in s], flush=True)\n    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != awake.ENV})
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == len(os.sched_getaffinity(0))
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    assert _wait_for(lambda: all(gone(p) for p in pids)), "a spinner outlived the simpar that started it"


def _idle_siblings(ctx, launcher: int) -> int:
    """The processes beside this rank (children of the launcher) that run at idle priority."""
    return len([p for p in _spinners_of(launcher) if os.sched_getscheduler(p) == os.SCHED_IDLE])


@pytest.mark.slow
def test_gloo_ranks_run_beside_the_spinners_and_leave_none(monkeypatch):
    monkeypatch.delenv(awake.ENV, raising=False)
    seen = launch(_idle_siblings, 2, (os.getpid(),), timeout=60)
    assert seen == [len(os.sched_getaffinity(0))] * 2
    assert _spinners_of(os.getpid()) == set()


def _profile(kept_awake: bool) -> HardwareProfile:
    return HardwareProfile(machine={"host": "vm", "cores": 2, "kept_awake": kept_awake},
                           compute={"fp32": {"fwd": [1e-4] * 3 + [1e10], "bwd": [2e-4] * 3 + [1e10]}},
                           ring={"2": [1e-3, 1e9]}, optimizer_params_per_s={"adam": 1e8}, copy_bytes_per_s=1e10)


def test_profiles_taken_one_with_the_cores_kept_awake_one_without_are_not_averaged():
    with pytest.raises(SimparError, match="--average: b.json and a.json were calibrated one with the cores kept "
                                          "awake, one without"):
        average_profiles([_profile(True), _profile(False)], ["a.json", "b.json"])
    assert average_profiles([_profile(True), _profile(True)], ["a.json", "b.json"]).machine["kept_awake"]
