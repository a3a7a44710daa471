"""Rank workers the graders launch on gloo (module-level, so spawned processes can find them);
each loads the solution under grading again from its spec."""

from __future__ import annotations

import torch

from simpar.course.adapter import load
from simpar.course.comm import Comm
from simpar.real.launch import launch


def _ring_worker(ctx, spec: str, numel: int):
    solution = load(spec)
    comm = Comm(ctx.rank, ctx.world)
    # rank r holds i + r + 1 at position i; the sum is world * i + (1 + 2 + ... + world)
    tensor = torch.arange(numel, dtype=torch.float32) + (ctx.rank + 1)
    solution.ring_allreduce(tensor, comm)
    return tensor.tolist(), comm.bytes_sent, comm.bytes_received


def run_ring_allreduce(spec: str, world: int, numel: int, timeout: float = 60.0) -> list:
    """Per rank: (values after the all-reduce, bytes sent, bytes received)."""
    return launch(_ring_worker, world, (spec, numel), timeout=timeout)


def _batch(spec, rank: int, seed: int, step: int):
    generator = torch.Generator().manual_seed(seed * 1000 + step * 31 + rank)
    ids = torch.randint(0, spec.vocab, (2, spec.seq), generator=generator)
    return ids, torch.roll(ids, -1, dims=1)


def train_tiny(make_update, rank: int, world: int, steps: int, seed: int = 0) -> torch.Tensor:
    """Train the tiny GPT for ``steps`` steps on rank's micro-batches, ``make_update(flat)`` giving
    the object whose ``step(flat_grads)`` updates the flat parameters; the final flat parameters."""
    from simpar.models import model
    from simpar.real.model import build_model

    spec = model("tiny")
    torch.manual_seed(seed)
    net = build_model(spec)
    params = list(net.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach().clone()
    update = make_update(flat)
    for step in range(steps):
        torch.nn.utils.vector_to_parameters(flat, params)
        net.zero_grad(set_to_none=True)
        ids, targets = _batch(spec, rank, seed, step)
        logits = net(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        update.step(torch.nn.utils.parameters_to_vector([p.grad for p in params]))
    return flat, update


OPTIMIZERS = {"sgd": lambda params: torch.optim.SGD(params, lr=0.1),
              "adam": lambda params: torch.optim.Adam(params, lr=1e-2)}


class FullBatch:
    """One process on every rank's micro-batch at once: the reference ZeRO-2 must match."""

    def __init__(self, world: int, optimizer: str):
        self.world, self.make_optimizer = world, OPTIMIZERS[optimizer]

    def train(self, steps: int, seed: int = 0) -> torch.Tensor:
        from simpar.models import model
        from simpar.real.model import build_model

        spec = model("tiny")
        torch.manual_seed(seed)
        net = build_model(spec)
        optimizer = self.make_optimizer(list(net.parameters()))
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            losses = []
            for rank in range(self.world):
                ids, targets = _batch(spec, rank, seed, step)
                logits = net(ids)
                losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                                targets.reshape(-1)))
            (sum(losses) / self.world).backward()
            optimizer.step()
        return torch.nn.utils.parameters_to_vector(net.parameters()).detach()


def _zero2_worker(ctx, spec: str, steps: int, optimizer: str):
    torch.set_num_threads(1)
    solution = load(spec)
    comm = Comm(ctx.rank, ctx.world)
    make = OPTIMIZERS[optimizer]
    flat, update = train_tiny(lambda flat: solution.Zero2(flat, comm, make), ctx.rank, ctx.world, steps)
    start, end = solution.shard_range(flat.numel(), ctx.rank, ctx.world)
    return flat.tolist(), comm.bytes_sent, update.optimizer_state_bytes(), (start, end)


def run_zero2(spec: str, world: int, steps: int, optimizer: str, timeout: float = 120.0) -> list:
    """Per rank: (final flat parameters, bytes sent, optimizer state bytes, its shard range)."""
    return launch(_zero2_worker, world, (spec, steps, optimizer), timeout=timeout)


def _dispatch_worker(ctx, spec: str, experts: int, capacity: int, tokens: int, hidden: int):
    """A5: dispatch this rank's tokens to the ranks of their experts (expert e scales by e + 1) and back."""
    solution = load(spec)
    comm = Comm(ctx.rank, ctx.world)
    generator = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(tokens, hidden, generator=generator)
    expert = torch.randint(0, experts, (tokens,), generator=generator)
    buffer, slot = solution.dispatch_buffer(x, expert, experts, capacity)
    local = experts // ctx.world
    arrived = solution.all_to_all(list(buffer.split(local)), comm)  # my experts' rows from every rank
    scale = (torch.arange(local) + ctx.rank * local + 1.0).view(local, 1, 1)
    back = solution.all_to_all([rows * scale for rows in arrived], comm)
    out = solution.combine(torch.cat(back), expert, slot)
    return x.tolist(), expert.tolist(), out.tolist(), comm.bytes_sent, comm.bytes_received


def run_dispatch(spec: str, world: int, experts: int, capacity: int, tokens: int, hidden: int,
                 timeout: float = 60.0) -> list:
    """Per rank: (tokens, their experts, outputs combined back, bytes sent, bytes received)."""
    return launch(_dispatch_worker, world, (spec, experts, capacity, tokens, hidden), timeout=timeout)
