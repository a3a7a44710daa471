"""Small workers for ``launch``: collectives whose results and bytes can be checked, and planted
faults (a rank that raises, one that hangs) for the teardown tests."""

from __future__ import annotations

import sys
import time

import torch

from simpar.real.comm import CountingComm


def collective_worker(ctx, algo: str, op: str, numel: int, dtype: str = "float32") -> dict:
    """Every rank contributes (rank + 1) * arange(numel); returns its output and byte counts."""
    comm = CountingComm(ctx.rank)
    group = list(range(ctx.world))
    flat = (ctx.rank + 1) * torch.arange(numel, dtype=getattr(torch, dtype))
    with ctx.op(f"{algo} {op} of {numel} elements"):
        if algo == "ps":
            out = comm.ps_all_reduce(flat, group)
        elif op == "allreduce":
            out = comm.ring_all_reduce(flat, group)
        elif op == "reducescatter":
            out = comm.ring_reduce_scatter(flat, group)
        else:
            out = comm.ring_all_gather(torch.tensor_split(flat, ctx.world)[ctx.rank], numel, group)
    return {"out": out, "sent": comm.sent, "received": comm.received}


def coalesced_worker(ctx, sizes: list[int]) -> dict:
    """Pieces of ``sizes`` elements (rank-dependent values) reduce-scattered in one coalesced ring and
    one by one: both outputs, the bytes and the exchanges (point-to-point messages sent) of each."""
    comm = CountingComm(ctx.rank)
    group = list(range(ctx.world))
    out = {}
    for how in ("coalesced", "one by one"):
        flat = torch.cat([(ctx.rank + 1) * torch.arange(n, dtype=torch.float32) / (i + 1)
                          for i, n in enumerate(sizes)])
        pieces = list(torch.split(flat, sizes))
        sends, exchange = [0], comm._exchange
        comm._exchange = lambda *a: (sends.__setitem__(0, sends[0] + 1), exchange(*a))
        before = comm.sent
        with ctx.op(f"{how} reduce-scatter of {sizes}"):
            if how == "coalesced":
                result = comm.ring_reduce_scatter_coalesced(pieces, group)
            else:
                result = torch.cat([comm.ring_reduce_scatter(piece, group) for piece in pieces])
        comm._exchange = exchange
        out[how] = {"out": result, "sent": comm.sent - before, "exchanges": sends[0]}
    return out


def failing_worker(ctx, bad_rank: int) -> int:
    with ctx.op("forward of unit 1"):
        if ctx.rank == bad_rank:
            raise RuntimeError("planted failure")
    return ctx.rank


def hanging_worker(ctx, bad_rank: int) -> int:
    with ctx.op("all-gather of unit 2"):
        if ctx.rank == bad_rank:
            time.sleep(3600)
    return ctx.rank


def inherited_worker(ctx) -> dict:
    """What a forked rank finds already done by the fork server (prewarm.py), before it does anything itself."""
    return {"modules": [name for name in ("simpar.real.executor", "simpar.calibrate",
                                          "torch.fx.experimental.symbolic_shapes") if name in sys.modules],
            "threads": torch.get_num_threads()}


def returning_worker(ctx) -> int:
    """Returns at once: a rank that leaves while its peers may still be joining the group."""
    return ctx.rank
