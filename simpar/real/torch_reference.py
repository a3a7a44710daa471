"""PyTorch's own data-parallel implementations, trained on the same model, seed and batches as the
executor, so simpar's strategies can be cross-checked against them:

- ``ddp``: torch.nn.parallel.DistributedDataParallel (no_sync while accumulating);
- ``zero1``: DDP with torch.distributed.optim.ZeroRedundancyOptimizer;
- ``zero3``: FSDP2, ``fully_shard`` on every transformer block and on the whole model (the
  embedding and head share the root's group, which keeps a tied weight in one place).

Each is a ``launch`` worker returning the losses and every unit's final parameters.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from simpar.real.states import LEARNING_RATE, make_optimizer
from simpar.real.model import build_model, synthetic_batch
from simpar.scenario import Scenario

IMPLEMENTATIONS = ("ddp", "zero1", "zero3")
_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def torch_worker(ctx, scenario: Scenario, implementation: str, steps: int, seed: int) -> dict:
    spec, train = scenario.model, scenario.train
    m, b = scenario.microbatches, train.micro_batch
    model = build_model(spec, seed)
    if implementation == "zero3":
        for block in model.units[1:-1]:
            fully_shard(block)
        wrapped = fully_shard(model)
        optimizer = make_optimizer(train.optimizer, model.parameters())
    else:
        wrapped = DistributedDataParallel(model)
        optimizer = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=_OPTIMIZERS[train.optimizer],
                                             lr=LEARNING_RATE)
                     if implementation == "zero1" else make_optimizer(train.optimizer, model.parameters()))
    losses = []
    for step in range(steps):
        ids, targets = synthetic_batch(spec, train.global_batch, step, seed)
        local = 0.0
        for mb in range(m):
            rows = slice((ctx.rank * m + mb) * b, (ctx.rank * m + mb + 1) * b)
            last = mb == m - 1
            if implementation == "zero3":
                wrapped.set_requires_gradient_sync(last)
            with nullcontext() if last or implementation == "zero3" else wrapped.no_sync():
                logits = wrapped(ids[rows])
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets[rows].reshape(-1)) / m
                loss.backward()
            local += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = torch.tensor([local])
        dist.all_reduce(total)
        losses.append(float(total) / ctx.world)
    return {"losses": losses, "params": _full_params(model, implementation)}


def _full_params(model, implementation: str) -> dict[int, torch.Tensor]:
    params = {}
    for u, unit in enumerate(model.units):
        tensors = [p.full_tensor() if implementation == "zero3" else p for p in unit.parameters()]
        params[u] = torch.cat([t.detach().reshape(-1) for t in tensors])
    return params
