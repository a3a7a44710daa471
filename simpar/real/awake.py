"""Keep this machine's cores awake while gloo ranks run on it: one idle-priority spinner per core.

Why: on the development VM (a Firecracker guest, kernel tick 250 Hz, no cpuidle driver: an idle
vCPU halts), waking a thread on an *idle* vCPU often waits for that vCPU's next 4 ms tick instead
of taking a few microseconds. A rank blocked in a gloo receive is woken that way whenever the data
lands while its core is idle, so 16-20 % of the executor's ring exchanges at 2 ranks took 4 ms
instead of 0.15-0.25 ms (back to back, 4 KiB: mean 0.85 ms against a median of 0.26), and with
each rank's threads pinned to their own core 93-95 % did (mean 3.7 ms). That cost belongs to
this VM's idle states, not to the algorithm the executor referees, and it comes and goes with
where the scheduler places the threads, so it made the measured step time both longer and
noisier. A core running a spinner never halts; the spinner is ``SCHED_IDLE``, so any rank that
wakes preempts it at once and it takes no share worth measuring from a rank that computes.
Measured with two spinners: calls over 2 ms 1-4 % of the time, all-gathers 0.35 ms on average
(exchanges 0.20-0.24 ms; 0.11-0.36 ms pinned).

The spinners are plain ``python -c`` processes (no torch import: they start in milliseconds), die
with simpar (``PR_SET_PDEATHSIG``), and are killed and reaped when the ranks are. Set
``SIMPAR_KEEP_AWAKE=0`` to run without them (a profile calibrated one way prices runs taken the
same way: the profile records it).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

ENV = "SIMPAR_KEEP_AWAKE"

# the spinner: die with the parent (prctl PR_SET_PDEATHSIG = 1, SIGKILL = 9), pin to one core, idle
# priority, spin; where idle priority cannot be set the spinner exits with the error: it is an aid to
# the ranks, not a need, and must never compete with them at normal priority
_SPINNER = """
import ctypes, ctypes.util, os, sys
parent, core = int(sys.argv[1]), int(sys.argv[2])
ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").prctl(1, 9, 0, 0, 0)
if os.getppid() != parent:
    sys.exit(0)
os.sched_setaffinity(0, {core})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
while True:
    pass
"""


def enabled() -> bool:
    """Whether gloo runs on this machine get spinners: on Linux, unless ``SIMPAR_KEEP_AWAKE=0``."""
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_getaffinity")


@contextlib.contextmanager
def cores_kept_awake(active: bool = True):
    """Run the body with one spinner per core this process may use (when ``active`` and ``enabled()``);
    yields the spinners' processes (empty when none run)."""
    spinners: list[subprocess.Popen] = []
    cores = sorted(os.sched_getaffinity(0)) if active and enabled() else []
    for core in cores:
        spinners.append(subprocess.Popen([sys.executable, "-c", _SPINNER, str(os.getpid()), str(core)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL))
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
