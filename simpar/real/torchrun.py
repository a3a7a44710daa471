"""The executor under ``torchrun``, for runs across machines: every process is one rank.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m simpar.real.torchrun --strategy zero2 --gpus 16 [any 'simpar run' flag]

It takes the flags of ``simpar run`` (``--compare-real`` is implied), performs the same Plan with the
same worker as ``simpar run --compare-real`` (``run_rank``), and rank 0 prints the side-by-side
table (or ``--json``). torchrun supplies RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; ``--gpus``
must equal WORLD_SIZE. If a rank fails, torchrun's agent stops the others.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from simpar.cli import build_parser
from simpar.cli.run import scenario_and_notes
from simpar.cli.run_compare import UNPRICED_STEPS, real_options, report
from simpar.errors import SimparError
from simpar.real.allocator import keep_freed_memory
from simpar.real.compare import real_json
from simpar.real.executor import check_supported, run_rank
from simpar.real.launch import _OP_CHARS, RankContext


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["run", *(sys.argv[1:] if argv is None else argv), "--compare-real"])
    scenario, notes = scenario_and_notes(args)
    steps, timeout, seed, backend, collectives = real_options(args)
    steps = steps or UNPRICED_STEPS  # auto: rank 0 prices the run only after it, outside the group
    check_supported(scenario)
    rank, world = int(os.environ.get("RANK", "-1")), int(os.environ.get("WORLD_SIZE", "0"))
    if rank < 0:
        raise SimparError("torchrun: RANK and WORLD_SIZE are not set; start this module with torchrun")
    if world != scenario.cluster.gpus:
        raise SimparError(f"--gpus: {scenario.cluster.gpus} ranks asked for, torchrun started {world}")
    keep_freed_memory()  # as every rank simpar launches itself (allocator.py)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    try:
        ctx = RankContext(rank, world, backend, bytearray(_OP_CHARS * world))
        mine = run_rank(ctx, scenario, steps, seed, collectives)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        code = 0
        if rank == 0:
            code = report(args, scenario, real_json(scenario, gathered, steps, collectives), backend, notes,
                          calibrate_now=False)  # not inside the group: launch's own ranks would meet torchrun's
        # every rank tears the group down together, once rank 0 has reported: on a loaded 2-core machine a
        # rank that left while rank 0 still simulated and printed aborted at exit ("terminate called without
        # an active exception", SIGABRT), and torchrun called the finished run failed
        dist.barrier()
        return code
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        exit_code = main()
    except SimparError as exc:
        print(f"simpar: error: {exc}", file=sys.stderr)
        exit_code = 2
    # Leave without the interpreter's teardown. Even after the barrier and destroy_process_group, a
    # finished rank on a loaded machine still aborted now and then while the interpreter finalised
    # ("terminate called without an active exception", SIGABRT: gloo's C++ threads and the objects
    # they hold being destroyed as Python shuts down), and torchrun called the finished run failed.
    # Everything this rank owes is printed and the group is destroyed, so nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
