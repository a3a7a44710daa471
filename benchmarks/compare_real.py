"""``simpar run --strategy zero2 --gpus N --compare-real`` as a new user meets it: from an empty cache, then again.

    python benchmarks/compare_real.py [--strategy zero2] [--gpus 2,4,16] [--repeat 3]

For each number of ranks, ``--repeat`` times: the command from an empty profile cache (a temporary
SIMPAR_CACHE: the first run measures what it needs), then once more from that cache. Prints each run's
wall time (a fresh process: start-up, calibration where there is one, simulation, the ranks, teardown),
the simulated and measured step times and the error. Targets on a 2-core machine: 2 and 4 ranks within
15 %, 16 ranks within 25 % (or the runs' spread), the first run at most 30 s longer than the second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run(strategy: str, gpus: str, cache: str) -> tuple[float, dict]:
    command = [sys.executable, "-m", "simpar", "run", "--strategy", strategy, "--gpus", gpus, "--compare-real",
               "--json", "-"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=dict(os.environ,
                                                                                        SIMPAR_CACHE=cache))
    return time.perf_counter() - start, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="zero2")
    parser.add_argument("--gpus", default="2,4,16", help="numbers of ranks, comma-separated")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"$ simpar run --strategy {args.strategy} --gpus N --compare-real   (first from an empty cache, then again)")
    for _ in range(args.repeat):
        for gpus in args.gpus.split(","):
            with tempfile.TemporaryDirectory() as cache:
                for label in ("first", "second"):
                    wall, result = run(args.strategy, gpus.strip(), cache)
                    sim, real = result["sim"]["step_time_s"], result["real"]["step_time_s"]
                    print(f"{gpus:>3} ranks {label:<6} wall {wall:5.1f} s  {result['real']['steps']:3d} steps  "
                          f"simulated {sim * 1e3:7.2f} ms  measured {real * 1e3:7.2f} ms  "
                          f"error {100 * (sim - real) / real:+4.0f} %", flush=True)


if __name__ == "__main__":
    main()
