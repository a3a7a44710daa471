"""``simpar search``: the fastest layouts of a model on a cluster that fit in memory."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

from tqdm import tqdm

from simpar import units
from simpar.cli.common import add_cluster_flags, add_json_flag, add_seq_flag, cluster_choice, with_seq, write_json
from simpar.errors import SimparError
from simpar.models import resolve_model
from simpar.search import DATA_PARALLEL, Search, ranked, run_search
from simpar.train import OPTIMIZERS, PRECISIONS

STRATEGIES = DATA_PARALLEL + ("3d",)


def register(sub) -> None:
    p = sub.add_parser("search", help="try every valid layout of a model on a cluster; print the fastest that fit",
                       description="Enumerate layouts (ddp, ZeRO-1/2/3, ZeRO-Offload; Megatron 3D over every "
                                   "dp x pp x tp split with tp inside a machine; micro-batch 1-8; recomputation "
                                   "none/selective/full; 1F1B, interleaved, ZB-H1 and ZB-V schedules; context "
                                   "parallelism, ring and Ulysses, for sequences of 8K tokens or more) at one "
                                   "global batch, drop those over the memory cap, simulate the rest and rank them "
                                   "by step time.")
    p.add_argument("--model", default="llama2-13b", help="preset or Hugging Face config.json (default llama2-13b)")
    add_seq_flag(p)
    p.add_argument("--gpus", help="number of GPUs (default 64; all of a --cluster's)")
    p.add_argument("--topology", help="cluster preset (default dgx-a100)")
    add_cluster_flags(p)
    p.add_argument("--global-batch", help="sequences per step, the same for every layout (default 4 x GPUs)")
    p.add_argument("--memory-cap", help="bytes a GPU may use (default: the GPU's memory), e.g. 80e9 or 70GiB")
    p.add_argument("--precision", default="bf16-mixed", help=f"one of {', '.join(PRECISIONS)}")
    p.add_argument("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)}")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated subset of {', '.join(STRATEGIES)} (default all)")
    p.add_argument("--top", default="10", help="how many of the fastest to print (default 10)")
    p.add_argument("--jobs", help="processes evaluating layouts (default: one per core)")
    p.add_argument("--exact", action="store_true",
                   help="simulate every layout in full (contention between overlapping transfers included; "
                        "slower) instead of the fast path")
    add_json_flag(p, "{search, ranked, counts}")
    p.set_defaults(handler=run)


def run(args) -> int:
    spec, notes = resolve_model(args.model)
    spec = with_seq(args, spec)
    topology, gpus = cluster_choice(args, "dgx-a100", 64)
    batch = units.positive_int(args.global_batch, "--global-batch") if args.global_batch else 4 * gpus
    cap = None if args.memory_cap is None else units.positive(args.memory_cap, "--memory-cap")
    top = units.positive_int(args.top, "--top")
    jobs = units.positive_int(args.jobs, "--jobs") if args.jobs else os.cpu_count() or 1
    strategies = tuple(s.strip().lower() for s in args.strategies.split(",") if s.strip())
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise SimparError(f"--strategies: unknown {', '.join(unknown) or '(none given)'}; choose from "
                          f"{', '.join(STRATEGIES)}")
    if args.precision not in PRECISIONS:
        raise SimparError(f"--precision: must be one of {', '.join(PRECISIONS)}, got {args.precision!r}")
    search_args = (spec, gpus, topology, batch, args.precision, args.optimizer, cap, args.exact, args.device)
    search = Search(*search_args)  # checks the topology and cap before any work
    todo = search.candidates(strategies)
    if not todo:
        raise SimparError(f"--global-batch: no layout of {spec.name} on {gpus} GPUs splits a global batch of {batch} "
                          "(it must divide by micro-batch x data-parallel degree)")
    started = time.perf_counter()
    with tqdm(total=len(todo), desc="layouts", unit="layout", file=sys.stderr, disable=None, leave=False) as bar:
        outcomes = run_search(search_args, todo, jobs, progress=lambda done: bar.update(done - bar.n))
    seconds = time.perf_counter() - started
    best = ranked(outcomes)
    counts = Counter(o.status for o in outcomes)
    summary = {"configurations": len(outcomes), "seconds": seconds, "per_minute": 60 * len(outcomes) / seconds,
               "fit": counts["fits"], "over_memory_cap": counts["oom"], "invalid": counts["invalid"],
               "extrapolated": sum(o.extrapolated for o in outcomes), "jobs": jobs}
    if args.json and write_json({"search": {"model": spec.name, "gpus": gpus, "topology": search.topology_name,
                                            "global_batch": batch, "memory_cap": search.memory_cap,
                                            "precision": args.precision, "optimizer": args.optimizer},
                                 "inputs": notes, "counts": summary,
                                 "ranked": [_row(o, batch * spec.seq) for o in best]}, args.json):
        return 0
    for note in notes:
        print(note)
    print(f"{spec.name} on {gpus} GPUs ({search.topology_name}), global batch {batch} x {spec.seq} tokens, "
          f"{args.precision}, memory cap {units.human_bytes(search.memory_cap)} per GPU")
    print(f"evaluated {len(outcomes)} layouts in {seconds:.1f} s ({summary['per_minute']:,.0f}/min, {jobs} "
          f"process(es)): {counts['fits']} fit, {counts['oom']} over the memory cap, {counts['invalid']} invalid")
    if not best:
        raise SimparError("--memory-cap: no layout fits; raise the cap, add GPUs, or shrink the global batch")
    print(f"\n{'#':>3}  {'layout':<74}{'step':>10}{'tokens/s':>12}{'peak':>11}")
    for i, outcome in enumerate(best[:top], 1):
        row = _row(outcome, batch * spec.seq)
        print(f"{i:>3}  {outcome.candidate.describe():<74}{units.human_time(row['step_time_s']):>10}"
              f"{row['tokens_per_s']:>12,.0f}{units.human_bytes(row['peak_bytes']):>11}")
    return 0


def _row(outcome, tokens: int) -> dict:
    c = outcome.candidate
    return {"strategy": c.strategy, "dp": c.dp, "pp": c.pp, "tp": c.tp, "micro_batch": c.micro_batch,
            "recompute": c.recompute, "schedule": c.schedule, "virtual_stages": c.virtual_stages,
            "step_time_s": outcome.step_time_s, "tokens_per_s": tokens / outcome.step_time_s,
            "peak_bytes": outcome.peak_bytes, "extrapolated": outcome.extrapolated}
