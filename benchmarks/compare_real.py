"""How long ``simpar run --strategy zero2 --gpus 16 --compare-real`` takes end to end.

    python benchmarks/compare_real.py [--strategy zero2] [--gpus 16] [--repeat 1]

Target: under 2 minutes on a 2-core machine (16 gloo ranks on 2 cores, tiny-deep model,
3 steps). Prints the wall time of each run, as a user would see it (a fresh process: Python and
torch start-up, simulation, spawning the ranks, the steps, teardown), and the measured and
simulated step times it reported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="zero2")
    parser.add_argument("--gpus", default="16")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    command = [sys.executable, "-m", "simpar", "run", "--strategy", args.strategy, "--gpus", args.gpus,
               "--compare-real", "--json", "-"]
    print(f"$ simpar run --strategy {args.strategy} --gpus {args.gpus} --compare-real")
    for _ in range(args.repeat):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - start
        result = json.loads(done.stdout)
        print(f"wall {wall:6.1f} s (target < 120 s)   measured step {result['real']['step_time_s'] * 1e3:8.1f} ms"
              f"   simulated step {result['sim']['step_time_s'] * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
