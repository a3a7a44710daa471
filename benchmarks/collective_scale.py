"""How simulation wall time grows with the number of simulated GPUs.

    python benchmarks/collective_scale.py [--topology dgx-a100] [--bytes 1GiB] [--algos ring,tree,hierarchical]

Prints, per GPU count and algorithm: wall time to build the topology, wall time to simulate one
all-reduce (first run, routes not yet cached), the simulated time and busbw. Target: a 1,024-GPU
ring all-reduce on dgx-a100 in well under a second of wall time.
"""

from __future__ import annotations

import argparse
import time

from simpar import topologies, units
from simpar.collective_run import simulate_collective


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="dgx-a100")
    parser.add_argument("--bytes", default="1GiB")
    parser.add_argument("--algos", default="ring,tree,hierarchical")
    parser.add_argument("--max-gpus", type=int, default=4096)
    args = parser.parse_args()
    nbytes = units.whole_bytes(args.bytes, "--bytes")
    print(f"# all-reduce of {nbytes:,} B on {args.topology}")
    print(f"# {'gpus':>6} {'algo':<13}{'build (s)':>10}{'simulate (s)':>13}{'sim time':>12}{'busbw':>12}")
    gpus = 8
    while gpus <= args.max_gpus:
        for algo in args.algos.split(","):
            start = time.perf_counter()
            topo = topologies.build(args.topology, gpus)
            built = time.perf_counter()
            result = simulate_collective(topo, "allreduce", algo, nbytes)
            done = time.perf_counter()
            print(f"  {gpus:>6} {algo:<13}{built - start:>10.3f}{done - built:>13.3f}"
                  f"{units.human_time(result.time_s):>12}{units.human_rate(result.busbw_Bps):>12}", flush=True)
        gpus *= 2


if __name__ == "__main__":
    main()
