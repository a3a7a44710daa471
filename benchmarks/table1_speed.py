"""How long simulating each row of Narayanan et al. 2021 Table 1 takes (3D layouts, 32-3,072 GPUs).

    python benchmarks/table1_speed.py [--rows 1,10] [--file validation/published.json]

Target: every row in at most 5 s of wall time on the 2-core development machine, the
1T / 3,072-GPU row included. Each row is one step of the paper's layout as ``simpar validate
--published`` prices it (micro-batch counts extrapolated once the pipeline is full); prints GPUs,
layout, micro-batches, wall time, and the simulated TFLOP/s per GPU beside the paper's.
"""

from __future__ import annotations

import argparse
import time

from simpar import published


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="first,last row (1-based) of set A to time (default: all)")
    parser.add_argument("--file", help="the published-measurement file (default: the one in validation/)")
    args = parser.parse_args()
    rows = [case for case in published.load(args.file) if case["set"] == "A"]
    if args.rows:
        first, last = (int(x) for x in args.rows.split(","))
        rows = rows[first - 1:last]
    print("# Narayanan et al. 2021 Table 1 rows, one simulated step each (target: <= 5 s wall per row)")
    print(f"#{'gpus':>6} {'tp':>3} {'pp':>3} {'v':>2} {'micro-batches':>13} {'wall (s)':>9} {'TFLOP/s sim':>12} "
          f"{'paper':>6}")
    for case in rows:
        lay = case["layout"]
        start = time.perf_counter()
        simulated = published.simulate_case(case)
        wall = time.perf_counter() - start
        dp = lay["gpus"] // (lay["tp"] * lay["pp"])
        microbatches = case["batch"] // (case["micro_batch"] * dp)
        print(f"{lay['gpus']:>7} {lay['tp']:>3} {lay['pp']:>3} {lay.get('virtual_stages', 1):>2} {microbatches:>13} "
              f"{wall:>9.2f} {simulated:>12.1f} {case['measured']:>6.0f}", flush=True)


if __name__ == "__main__":
    main()
