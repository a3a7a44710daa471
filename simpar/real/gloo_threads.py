"""Keep gloo's transport thread from preempting the rank it serves inside a collective: ``SCHED_BATCH``.

Why: gloo's TCP transport reads and writes with its own thread (``gloo_tcp_loop``, an ``epoll`` loop, one per
process group). A rank's main thread holds the pair's mutex while it posts a send or receive; the loop thread,
woken by the peer's data, only *tries* that mutex, and the socket it left unread wakes it again at once, so it
spins. Woken as an ordinary thread it preempts the main thread on their core (the scheduler favours a thread
that slept over one that has computed) and keeps the core while it spins, so the main thread, the one holding
the mutex, waits on the run queue (docs/calibration.md, "gloo's transport thread at SCHED_BATCH"). On the
development VM (2 vCPUs, 2026-11-29) that spin was most of a collective's cost: at 2 ranks ZeRO-3's loop threads
ran 17-36 ms of CPU a step and its main threads waited 28-41 ms a step on the run queue, in steps of 91-115 ms.
``SCHED_BATCH`` is the ordinary policy without wakeup preemption: the loop thread still gets a fair share and
still preempts an idle-priority spinner (awake.py) at once, but no longer the thread it serves.

Only for the span of a collective (``in_batch`` on the comm's ring and Worker-Server methods): a pipeline's
``isend`` leaves the loop thread to write the data once the receiver posts, while its rank computes on, and
there the thread must preempt (the whole run at SCHED_BATCH slowed tiny-deep's pp at 2 ranks from 32 to 35-38 ms
a step, its receives after a send 1.0-1.8 -> 2.9-3.6 ms). Launches in pairs at 2 ranks, ordinary, then batch
for the whole run, then batch inside collectives (medians of a launch's steps, ms): ZeRO-3 92.3-93.0 /
58.7-61.4 / 54.3-60.5, tp 54.9-55.4 / 26.0-30.1 / 27.4-31.0, DDP 16.3-16.8 / 15.8-16.6 / 15.7-17.3, pp 31.7-31.8
/ 34.7-35.8 / 35.7-36.3 (that last with the pipeline's sends and receives inside the span too). Batch for the
whole run at 4 ranks on 2 cores: ZeRO-3 741-750 -> 198-200 ms, tp 372-384 -> 102-111, DDP 40-46 -> 32-33; at 8
ranks ZeRO-3 3.58 -> 0.77 s, tp 1.78 -> 0.50 s. That spin is this transport's on an oversubscribed VM, not the
algorithm's the executor referees. ``SIMPAR_GLOO_BATCH=1`` sets it (a profile calibrated one way prices runs taken
the same way: the profile records it). Not yet the default: the simulator, calibrated that way, read the 21 cases
5.5 / 20.6 % (median / max |error|), 17 of 21 short, tp and ZeRO-3 at 2 ranks -20.6 and -19.7 % (2026-11-30),
where with the spin it had read 1.6 / 9.5 %: the calibration's collectives no longer carry all a step's do, and
until that is found and priced the default keeps the executor and the profile it was validated with.
"""

from __future__ import annotations

import functools
import os

ENV = "SIMPAR_GLOO_BATCH"
THREAD = "gloo_tcp_loop"  # the name gloo's TCP transport gives its event-loop thread (Linux)

_threads: list[int] | None = None  # this process's transport threads, once looked up (refresh)
_depth = 0  # collectives in progress (an all-reduce is a reduce-scatter, then an all-gather)


def enabled() -> bool:
    """Whether gloo's loop threads run at ``SCHED_BATCH`` inside collectives: on Linux, with
    ``SIMPAR_GLOO_BATCH=1`` (not yet the default: see the module's docstring)."""
    return os.environ.get(ENV, "0") == "1" and hasattr(os, "SCHED_BATCH") and os.path.isdir("/proc/self/task")


def loop_threads() -> list[int]:
    """The ids of this process's gloo transport threads (none before a gloo group exists, or elsewhere)."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() == THREAD:
                    found.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def refresh() -> list[int]:
    """Look the transport threads up again (each new gloo group makes its own); [] where not ``enabled()``."""
    global _threads
    _threads = loop_threads() if enabled() else []
    return _threads


def _set(policy: int) -> None:
    for tid in _threads or ():
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError:  # not allowed here, or the thread ended: leave it as it is
            continue


def in_batch(method):
    """``method`` (a collective) runs with this process's transport threads at ``SCHED_BATCH``, ordinary again
    once the outermost such call returns (two system calls, about 3 us a call)."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        global _depth
        if _threads is None:
            refresh()
        if not _threads:
            return method(*args, **kwargs)
        if _depth == 0:
            _set(os.SCHED_BATCH)
        _depth += 1
        try:
            return method(*args, **kwargs)
        finally:
            _depth -= 1
            if _depth == 0:
                _set(os.SCHED_OTHER)
    return wrapper
