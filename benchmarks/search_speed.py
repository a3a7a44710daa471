"""How many layouts ``simpar search`` evaluates per minute.

    python benchmarks/search_speed.py [--model llama2-13b] [--gpus 64] [--topology dgx-a100] [--jobs 1,2]

Target: at least 1,000 configurations per minute on this 2-core machine for
``simpar search --model llama2-13b --gpus 64 --topology dgx-a100 --memory-cap 80e9``. Prints, per
number of processes: layouts, wall time, layouts per minute, how many fit (simulated), how many
were over the cap (their Plans built and walked, not simulated), and how many step times were
extrapolated from two short ones; then the fastest layout found.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from simpar import units
from simpar.models import model
from simpar.search import Search, ranked, run_search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama2-13b")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--topology", default="dgx-a100")
    parser.add_argument("--memory-cap", type=float, default=80e9)
    parser.add_argument("--jobs", default="1,2")
    args = parser.parse_args()
    spec = model(args.model)
    search_args = (spec, args.gpus, args.topology, 4 * args.gpus, "bf16-mixed", "adam", args.memory_cap)
    todo = Search(*search_args).candidates()
    print(f"{spec.name} on {args.gpus} GPUs ({args.topology}), global batch {4 * args.gpus}, "
          f"cap {units.human_bytes(args.memory_cap)}: {len(todo)} layouts")
    print(f"{'jobs':>5}{'wall':>9}{'per min':>10}{'fit':>6}{'over cap':>10}{'extrapolated':>14}")
    for jobs in (int(j) for j in args.jobs.split(",")):
        start = time.perf_counter()
        outcomes = run_search(search_args, todo, jobs)
        wall = time.perf_counter() - start
        counts = Counter(o.status for o in outcomes)
        print(f"{jobs:>5}{wall:>8.1f}s{60 * len(outcomes) / wall:>10,.0f}{counts['fits']:>6}{counts['oom']:>10}"
              f"{sum(o.extrapolated for o in outcomes):>14}")
    best = ranked(outcomes)[0]
    print(f"fastest: {best.candidate.describe()}: {units.human_time(best.step_time_s)}, "
          f"peak {units.human_bytes(best.peak_bytes)}")


if __name__ == "__main__":
    main()
