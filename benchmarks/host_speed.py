"""How fast is each core of this machine, moment by moment? The noise under `simpar validate`.

    python benchmarks/host_speed.py [--seconds 30] [--window 0.25]

One plain process per core, pinned to it, all at once: each computes calibration's unit (a
tiny-deep layer's forward and backward at micro-batch 2, ``_unit_burst``) over and over for
``--seconds``, no ranks, no communication, no spinners. Prints, per core, the median unit time in
each ``--window`` (a trace), the fast and slow medians (split at 1.25x the fastest windows' time), the
share of windows slow, how long the slow and fast stretches last, and how the cores' traces correlate.
On the development VM (a Firecracker guest) each core flipped between a fast and a slow state on its
own: a run of a fraction of a second draws one state per rank, which is why validate's runs last
seconds (``--seconds`` there).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np


def trace(core: int, seconds: float, out) -> None:
    os.sched_setaffinity(0, {core})
    import torch

    from simpar.calibrate.bench import _unit_burst

    torch.set_num_threads(1)
    unit = _unit_burst()
    for _ in range(5):
        unit()
    marks, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        unit()
        marks.append((began, time.perf_counter() - began))
    out.put((core, marks))


def windows(marks: list[tuple[float, float]], origin: float, width: float) -> dict[int, float]:
    bins: dict[int, list[float]] = {}
    for began, seconds in marks:
        bins.setdefault(int((began - origin) / width), []).append(seconds)
    return {k: statistics.median(v) for k, v in bins.items()}


def stretches(slow: list[bool], width: float) -> tuple[list[float], list[float]]:
    """Durations (seconds) of the runs of slow and of fast windows, the partial ones at the ends left out."""
    runs, current = {True: [], False: []}, 1
    for i in range(1, len(slow)):
        if slow[i] == slow[i - 1]:
            current += 1
            continue
        if i - current > 0:
            runs[slow[i - 1]].append(current * width)
        current = 1
    return runs[True], runs[False]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=0.25)
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    context = mp.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=trace, args=(c, args.seconds, out)) for c in cores]
    for w in workers:
        w.start()
    results = dict(out.get() for _ in workers)
    for w in workers:
        w.join()
    origin = min(m[0][0] for m in results.values())
    traces = {c: windows(m, origin, args.window) for c, m in results.items()}
    shared = sorted(set.intersection(*(set(t) for t in traces.values())))
    fastest = np.percentile([t[k] for t in traces.values() for k in shared], 10)
    threshold = 1.25 * fastest
    print(f"{len(cores)} cores, {args.seconds:.0f} s, windows of {args.window} s; slow: a window's median unit "
          f"above {1e3 * threshold:.2f} ms (1.25x the fastest tenth)")
    for core, t in traces.items():
        values = [t[k] for k in shared]
        slow = [v > threshold for v in values]
        slow_runs, fast_runs = stretches(slow, args.window)
        fast_med = statistics.median([v for v in values if v <= threshold] or [float("nan")])
        slow_med = statistics.median([v for v in values if v > threshold] or [float("nan")])
        print(f"core {core}: " + " ".join(f"{1e3 * v:.1f}" for v in values))
        print(f"  fast {1e3 * fast_med:.2f} ms, slow {1e3 * slow_med:.2f} ms ({slow_med / fast_med:.2f}x), "
              f"{sum(slow) / len(slow):.0%} of windows slow; stretches slow "
              f"{_span(slow_runs)}, fast {_span(fast_runs)}")
    if len(traces) > 1:
        matrix = np.corrcoef([[t[k] for k in shared] for t in traces.values()])
        print("correlation of the cores' traces: "
              + ", ".join(f"{a}-{b} {matrix[i, j]:+.2f}" for i, a in enumerate(traces) for j, b in enumerate(traces)
                          if i < j))
    return 0


def _span(durations: list[float]) -> str:
    if not durations:
        return "none complete"
    return f"{min(durations):.2f}-{max(durations):.2f} s (median {statistics.median(durations):.2f})"


if __name__ == "__main__":
    sys.exit(main())
