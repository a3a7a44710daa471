"""How long simulating one ZeRO-3 training step takes, as GPUs and layers grow.

    python benchmarks/zero3_scale.py [--model gpt3-175b] [--topology dgx-a100] [--gpus 64,256,1024]

Target: one ZeRO-3 step of gpt3-175b on 1,024 GPUs of dgx-a100 in at most 2 s of wall
time on a 2-core machine. Prints wall time (topology build, plan build, simulation) against GPU
count, then against layer count at the largest GPU count, with the simulated step time.
Full activation recomputation keeps gpt3-175b within 80 GB per GPU.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from simpar import units
from simpar.models import model
from simpar.scenario import make_scenario
from simpar.sim import build_topology, simulate
from simpar.strategies import build_plan


def measure(spec, gpus: int, topology: str) -> tuple[float, float, float, float]:
    start = time.perf_counter()
    scenario = make_scenario(spec, "zero3", gpus, topology=topology, recompute="full")
    topo = build_topology(scenario)
    built = time.perf_counter()
    plan = build_plan(scenario)
    planned = time.perf_counter()
    result = simulate(scenario, topo, plan)
    done = time.perf_counter()
    return built - start, planned - built, done - planned, result.step_time_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt3-175b")
    parser.add_argument("--topology", default="dgx-a100")
    parser.add_argument("--gpus", default="64,256,1024")
    args = parser.parse_args()
    spec = model(args.model)
    counts = [int(g) for g in args.gpus.split(",")]
    print(f"# ZeRO-3 step of {spec.name} ({spec.layers} layers) on {args.topology}, recompute full")
    print(f"# {'gpus':>6}{'layers':>8}{'topology (s)':>14}{'plan (s)':>10}{'simulate (s)':>14}{'total (s)':>11}"
          f"{'step time':>12}")
    rows = [(g, spec) for g in counts]
    rows += [(counts[-1], replace(spec, layers=n)) for n in (spec.layers // 4, spec.layers // 2, spec.layers * 2)]
    for gpus, variant in rows:
        topo_s, plan_s, sim_s, step = measure(variant, gpus, args.topology)
        print(f"  {gpus:>6}{variant.layers:>8}{topo_s:>14.3f}{plan_s:>10.3f}{sim_s:>14.3f}"
              f"{topo_s + plan_s + sim_s:>11.3f}{units.human_time(step):>12}", flush=True)


if __name__ == "__main__":
    main()
