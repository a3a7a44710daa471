"""Micro-benchmarks of the machine at hand, run as ``launch`` workers (every rank runs the same
benchmark at the same time, so running k ranks measures what k ranks sharing the machine get).

Nothing here runs a training strategy: compute is timed unit by unit (one embedding, one layer,
one head, forward and backward) on synthetic inputs, communication as bare ring exchanges, the
optimizer step and memory copies on bare tensors. ``simpar validate`` then judges the fitted
profile on whole strategies the fit never saw.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from simpar.models import model
from simpar.real.comm import CountingComm
from simpar.real.model import build_model
from simpar.real.states import make_optimizer
from simpar.scenario import make_scenario
from simpar.strategies.work import Work

DTYPES = {"fp32": torch.float32, "bf16-mixed": torch.bfloat16}


def _timed(fn, repeats: int) -> float:
    """Seconds per ``fn()`` with every rank running it ``repeats`` times back to back, from a barrier
    until all are done: k ranks sharing the cores are timed as a step would be, by how long all of
    them take. The closing barrier's own cost (measured alone) is taken off; the median of 5 rounds."""
    fn()

    def between_barriers(work) -> float:
        dist.barrier()
        start = time.perf_counter()
        work()
        dist.barrier()
        return time.perf_counter() - start

    barrier = statistics.median(between_barriers(lambda: None) for _ in range(5))
    rounds = [between_barriers(lambda: [fn() for _ in range(repeats)]) for _ in range(5)]
    return max(statistics.median(rounds) - barrier, 0.0) / repeats


def compute_worker(ctx, models: list[str], batches: list[int], precision: str, repeats: int) -> list[dict]:
    """Forward and backward time of each kind of unit, with the FLOPs the simulator prices it at."""
    torch.manual_seed(ctx.rank)
    rows = []
    for name in models:
        spec = model(name)
        net = build_model(spec).to(DTYPES[precision])
        for b in batches:
            work = Work(make_scenario(spec, "ddp", 1, micro_batch=b, precision=precision, topology="pcie"))
            ids = torch.randint(0, spec.vocab, (b, spec.seq))
            for kind, unit in (("embedding", 0), ("layer", 1), ("head", work.num_units - 1)):
                module = net.units[unit]
                hidden = torch.randn(b, spec.seq, spec.hidden, dtype=DTYPES[precision])

                def forward():
                    x = ids if unit == 0 else hidden.detach().requires_grad_()
                    out = module(x)
                    if kind == "head":
                        out = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), ids.reshape(-1))
                    return out

                def backward():
                    out = forward()
                    out.backward(None if kind == "head" else torch.ones_like(out))

                fwd = _timed(forward, repeats)
                both = _timed(backward, repeats)
                net.zero_grad(set_to_none=True)
                u = work.units[unit]
                rows.append({"model": name, "batch": b, "unit": kind, "fwd_flops": u.fwd_flops,
                             "bwd_flops": u.bwd_flops, "fwd_s": fwd, "bwd_s": max(both - fwd, 0.0)})
    return rows


def ring_worker(ctx, sizes: list[int], repeats: int) -> list[dict]:
    """A ring all-gather of each size over every rank, with the executor's own code (k - 1 ring
    steps of size/k bytes each, the chunks copied into place), every rank at once; each timed alone
    (median of 5 x ``repeats``): the steps keep the ranks in step, a barrier would cost more."""
    comm = CountingComm(ctx.rank)
    group = list(range(ctx.world))
    rows = []
    for size in [sizes[0]] + list(sizes):  # the first size twice: its first pass warms the connections up
        numel = max(size // 4, ctx.world)
        mine = torch.tensor_split(torch.zeros(numel), ctx.world)[ctx.rank]
        samples = []
        dist.barrier()
        for _ in range(5 * repeats + 2):
            start = time.perf_counter()
            comm.ring_all_gather(mine, numel, group)
            samples.append(time.perf_counter() - start)
        rows.append({"bytes": numel * 4, "seconds": statistics.median(samples[2:])})
    return rows[1:]


def host_worker(ctx, params: list[int], repeats: int) -> dict:
    """Optimizer steps (Adam, SGD) and memory copies on bare tensors."""
    steps, copies = [], []
    for n in params:
        weight = torch.nn.Parameter(torch.randn(n))
        weight.grad = torch.randn(n)
        for name in ("adam", "sgd"):
            optimizer = make_optimizer(name, [weight])
            steps.append({"optimizer": name, "params": n, "seconds": _timed(optimizer.step, repeats)})
        target = torch.empty(n)
        copies.append({"bytes": 4 * n, "seconds": _timed(lambda: target.copy_(weight.detach()), repeats)})
    return {"steps": steps, "copies": copies}
