"""Keep gloo's transport thread from preempting the rank it serves: ``SCHED_BATCH``.

Why: gloo's TCP transport reads and writes with its own thread (``gloo_tcp_loop``, an ``epoll`` loop, one per
process group). A rank's main thread holds the pair's mutex while it posts a send or receive; the loop thread,
woken by the peer's data, only *tries* that mutex, and the socket it left unread wakes it again at once, so it
spins. Woken as an ordinary thread it preempts the main thread on their core (the scheduler favours a thread
that slept over one that has computed) and keeps the core while it spins, so the main thread, the one holding
the mutex, waits on the run queue (docs/calibration.md, "A call's wake follows the rank's pace"). On the
development VM (2 vCPUs, 2026-11-29) that spin was most of a call's cost: at 2 ranks ZeRO-3's loop threads ran
27-35 ms of CPU a step and its main threads waited 28-36 ms a step on the run queue, in steps of 91-115 ms.
``SCHED_BATCH`` is the ordinary policy without wakeup preemption: the loop thread still gets a fair share and
still preempts an idle-priority spinner (awake.py) at once, but no longer the thread it serves. Launches in
pairs, the same code and steps, ordinary then batch (medians of a launch's steps): ZeRO-3 at 2 ranks 91-115 ->
56-77 ms a step (loop CPU 17-36 -> 11 ms, run-queue wait 28-41 -> 12-18 ms), tp 69-72 -> 30-35 ms, DDP 15.5-15.8
-> 13.9-17.7 ms, pp 32.0-34.5 -> 36.1-37.2 ms (the one case it slows); at 4 ranks on 2 cores ZeRO-3 741-750 ->
198-200 ms, tp 372-384 -> 102-111, DDP 40-46 -> 32-33, pp 77-78 -> 73-79; at 8 ranks ZeRO-3 3.58 -> 0.77 s, tp
1.78 -> 0.50 s, DDP 111 -> 82 ms (one launch each). That cost is this transport's on an oversubscribed VM,
not the algorithm's the executor referees. Set ``SIMPAR_GLOO_BATCH=0`` to leave the threads as gloo made them
(a profile calibrated one way prices runs taken the same way: the profile records it).
"""

from __future__ import annotations

import os

ENV = "SIMPAR_GLOO_BATCH"
THREAD = "gloo_tcp_loop"  # the name gloo's TCP transport gives its event-loop thread (Linux)


def enabled() -> bool:
    """Whether gloo's loop threads run at ``SCHED_BATCH``: on Linux, unless ``SIMPAR_GLOO_BATCH=0``."""
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "SCHED_BATCH") and os.path.isdir("/proc/self/task")


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


def batch_loop_threads() -> int:
    """Put every gloo transport thread of this process at ``SCHED_BATCH`` (once each new group has made its
    own); returns how many were set. Nothing where ``enabled()`` says no."""
    if not enabled():
        return 0
    done = 0
    for tid in loop_threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            done += 1
        except (OSError, ProcessLookupError):  # not allowed here, or the thread ended: leave it as it is
            continue
    return done
