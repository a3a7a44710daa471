"""Perform a Plan for real: each rank walks its Program's ops and does them with real tensors.

Ops are performed in the order the strategy wrote them (every op's dependencies come earlier),
so streams do not yet overlap here; what is real is the work: per-unit forward and backward with
autograd, collectives as counted point-to-point sends of the Plan's algorithm, the optimizer
step on the whole model or on the rank's shard.

So far the data-parallel strategies dp, ddp, zero1, zero2 and zero3 in fp32 (the CPU path); the
rest raise a clear error naming the strategy. ZeRO-3 here is faithful in traffic and arithmetic
(each unit is gathered from the shards before its forward and backward, its gradients
reduce-scattered after), but the full parameters stay allocated between uses.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F

from simpar.errors import SimparError
from simpar.plan import Alloc, Collective, Compute, Copy, Free, Recv, Send
from simpar.real.comm import CountingComm
from simpar.real.model import build_model, synthetic_batch
from simpar.real.tensor_parallel import TensorParallelModel, gather_full_parameters
from simpar.scenario import Scenario
from simpar.strategies import build_plan

SUPPORTED = ("dp", "ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "pp", "tp", "3d")
LEARNING_RATE = 1e-3


def make_optimizer(name: str, params):
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(params, lr=LEARNING_RATE)
    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9 if name == "sgd-momentum" else 0.0)


def check_supported(scenario: Scenario) -> None:
    if scenario.strategy.name not in SUPPORTED:
        raise SimparError(f"--compare-real: the executor performs {', '.join(SUPPORTED)} so far, "
                          f"not {scenario.strategy.name}")
    if scenario.strategy.pp > 1 and scenario.model.tied_embeddings:
        raise SimparError(f"--model: {scenario.model.name} ties its embedding and head, which the executor "
                          "cannot split across pipeline stages yet; use an untied model")
    if scenario.strategy.tp > 1 and scenario.model.vocab % scenario.strategy.tp:
        raise SimparError(f"--tp: the executor splits {scenario.model.name}'s vocabulary of {scenario.model.vocab} "
                          f"evenly, which tp {scenario.strategy.tp} does not divide")
    if scenario.train.precision != "fp32":
        raise SimparError("--precision: the CPU executor runs fp32 (use --precision fp32)")


class RankExecutor:
    def __init__(self, ctx, scenario: Scenario, seed: int):
        check_supported(scenario)
        self.ctx, self.scenario, self.seed = ctx, scenario, seed
        self.plan = build_plan(scenario)
        self.program = self.plan.program_of(ctx.rank)
        self.model = build_model(scenario.model, seed)
        grid = self.plan.grid
        self.tp_group = list(grid.group(ctx.rank, "tp"))
        if grid.tp > 1:  # this rank's slice of the same seeded model
            self.model = TensorParallelModel(self.model, self.tp_group.index(ctx.rank), grid.tp)
        self.reduction = None  # TP: the partial result the Plan's next TP all-reduce sums
        self.unit_params = [list(unit.parameters()) for unit in self.model.units]
        self.comm = CountingComm(ctx.rank)
        self.group = list(self.plan.grid.group(ctx.rank, "dp"))
        self.index = self.group.index(ctx.rank)  # this rank's share of the batch
        self.sharded = any(isinstance(op, Collective) and op.op == "reducescatter" for op in self.program.ops)
        self.held = sorted({op.unit for op in self.program.ops if isinstance(op, Compute) and op.unit >= 0})
        self.grads_sharded = self._sharded_state("grads")  # so they live only as the reduced shard
        self.params_sharded = self._sharded_state("params")  # then no rank holds the updated whole
        self.pending_sends: list = []
        self.copied = 0  # offload bytes between "GPU" and "host" memory (both DRAM on a CPU run)
        self.host_grads: dict[tuple[int, ...], torch.Tensor] = {}
        self.shards: dict[tuple[int, ...], torch.nn.Parameter] = {}
        self.shard_grads: dict[tuple[int, ...], torch.Tensor] = {}
        if self.sharded:
            for op in self.program.ops:
                if isinstance(op, Collective) and op.op == "reducescatter" and op.units not in self.shards:
                    chunk = torch.tensor_split(self._flat(op.units, "data"), len(self.group))[self.index]
                    self.shards[op.units] = torch.nn.Parameter(chunk.clone())
            self.optimizer = make_optimizer(scenario.train.optimizer, list(self.shards.values()))
        else:
            self.optimizer = make_optimizer(scenario.train.optimizer, self.model.parameters())

    def _sharded_state(self, category: str) -> bool:
        """Whether the Plan keeps this model state as a shard: it allocates less than the whole."""
        whole = self.scenario.train.weight_bytes * sum(p.numel() for u in self.held for p in self.unit_params[u])
        held = sum(op.nbytes for op in self.program.ops
                   if isinstance(op, Alloc) and op.category == category and op.payload == "model states")
        return held < whole

    def _flat(self, units, what: str) -> torch.Tensor:
        tensors = [getattr(p, what) for u in units for p in self.unit_params[u]]
        return torch.cat([t.reshape(-1) if t is not None else torch.zeros(0) for t in tensors])

    def _unflatten_into(self, units, flat: torch.Tensor, what: str) -> None:
        offset = 0
        for u in units:
            for p in self.unit_params[u]:
                piece = flat[offset:offset + p.numel()].view_as(p)
                if what == "grad":
                    p.grad = piece.clone()
                else:
                    p.data.copy_(piece)
                offset += p.numel()

    def step(self, step: int) -> float:
        spec, train = self.scenario.model, self.scenario.train
        m, b = self.scenario.microbatches, train.micro_batch
        ids, targets = synthetic_batch(spec, train.global_batch, step, self.seed)
        inputs: dict = {}
        outputs: dict = {}
        grad_out: dict = {}  # gradients of a chunk's output, received from the next stage
        loss_total = 0.0
        pieces: dict = defaultdict(int)  # (unit, micro-batch, phase) -> compute ops seen (TP: halves)
        for op in self.program.ops:
            with self.ctx.op(f"step {step} op {op.id} {type(op).__name__} {getattr(op, 'phase', '')}"
                             f"{getattr(op, 'op', '')} unit {getattr(op, 'unit', getattr(op, 'units', ''))}"):
                if isinstance(op, (Alloc, Free)):
                    continue
                if isinstance(op, Compute) and op.phase in ("fwd", "bwd"):
                    half = pieces[(op.unit, op.microbatch, op.phase)]
                    pieces[(op.unit, op.microbatch, op.phase)] += 1
                    rows = slice((self.index * m + op.microbatch) * b, (self.index * m + op.microbatch + 1) * b)
                    if op.phase == "fwd":
                        loss_total += self._forward(op, half, ids[rows], targets[rows], inputs, outputs)
                    else:
                        self._backward(op, half, inputs, outputs, grad_out)
                elif isinstance(op, Collective):
                    self._collective(op)
                elif isinstance(op, Compute) and op.phase == "step":
                    self._step()
                elif isinstance(op, Copy):
                    self._copy(op)
                elif isinstance(op, (Send, Recv)):
                    self._p2p(op, inputs, outputs, grad_out)
                else:
                    raise SimparError(f"--compare-real: the executor cannot perform {op!r} yet")
        for request in self.pending_sends:
            request.wait()
        self.pending_sends.clear()
        if isinstance(self.model, TensorParallelModel):
            loss_total, self.model.loss_total = self.model.loss_total, 0.0
        return self._mean_loss(loss_total)

    def _forward(self, op: Compute, half: int, ids, targets, inputs: dict, outputs: dict) -> float:
        """Forward of one unit (TP: one piece of it) on one micro-batch; returns its share of the loss."""
        key, m = (op.unit, op.microbatch), self.scenario.microbatches
        if half == 0:
            inputs[key] = ids if op.unit == 0 else outputs[(op.unit - 1, op.microbatch)].detach().requires_grad_()
        if isinstance(self.model, TensorParallelModel):
            self.reduction = self.model.forward_piece(op.unit, op.microbatch, half, inputs[key], targets, 1 / m,
                                                      outputs)
            return 0.0
        out = self.model.units[op.unit](inputs[key])
        if op.unit == len(self.model.units) - 1:  # mean over the micro-batch, scaled to the step's mean
            out = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), targets.reshape(-1)) / m
            outputs[key] = out
            return float(out.detach())
        outputs[key] = out
        return 0.0

    def _backward(self, op: Compute, half: int, inputs: dict, outputs: dict, grad_out: dict) -> None:
        key, head = (op.unit, op.microbatch), op.unit == len(self.model.units) - 1
        grad = None
        if half == 0 and not head:  # the gradient of this unit's output: from the next stage or unit
            grad = grad_out.pop(key) if key in grad_out else inputs.pop((op.unit + 1, op.microbatch)).grad
        if isinstance(self.model, TensorParallelModel):
            self.reduction = self.model.backward_piece(op.unit, op.microbatch, half, grad)
            return
        outputs.pop(key).backward(grad)

    def _tensor_parallel_allreduce(self) -> None:
        """Sum (or max) the pending partial result over the TP group; its continuation may leave
        the next one (the cross-entropy's maxima, then sums)."""
        reduction, self.reduction = self.reduction, None
        flat = reduction.tensor.reshape(-1).clone()
        total = self.comm.ring_all_reduce(flat, self.tp_group, reduction.op).view_as(reduction.tensor)
        self.reduction = reduction.then(total)

    def _mean_loss(self, local: float) -> float:
        total = torch.tensor([local])
        torch.distributed.all_reduce(total)  # reporting only: not counted as the Plan's traffic
        return float(total) / (self.plan.grid.dp * self.plan.grid.tp)  # every TP rank holds the loss

    def _p2p(self, op, inputs: dict, outputs: dict, grad_out: dict) -> None:
        """Activations forward and their gradients back between pipeline stages."""
        peer = self.plan.grid.peer(self.ctx.rank, op.peer)
        first, last, mb = op.units[0], op.units[-1], op.microbatch
        train, spec = self.scenario.train, self.scenario.model
        if isinstance(op, Recv):
            buffer = torch.empty(train.micro_batch, spec.seq, spec.hidden)
            self.comm.recv(buffer, peer)
            if op.tag.startswith("F"):
                outputs[(first - 1, mb)] = buffer  # the chunk's first unit reads it as its input
            else:
                grad_out[(last, mb)] = buffer
            return
        tensor = outputs[(last, mb)].detach() if op.tag.startswith("F") else inputs.pop((first, mb)).grad
        self.pending_sends.append(self.comm.isend(tensor.contiguous(), peer))

    def _reduce(self, op: Collective, flat: torch.Tensor) -> torch.Tensor:
        if op.op == "allreduce":
            if op.algo == "ps":
                return self.comm.ps_all_reduce(flat, self.group)
            return self.comm.ring_all_reduce(flat, self.group)
        return self.comm.ring_reduce_scatter(flat, self.group)

    def _collective(self, op: Collective) -> None:
        if op.group == "tp":
            return self._tensor_parallel_allreduce()
        if op.algo not in ("ring", "ps", None):
            raise SimparError(f"--algo: the executor performs ring and ps collectives, not {op.algo}")
        n = len(self.group)
        if op.op == "allreduce" and op.payload == "grads":
            self._unflatten_into(op.units, self._reduce(op, self._flat(op.units, "grad")) / n, "grad")
        elif op.op == "reducescatter" and op.payload == "grads":
            mine = self._reduce(op, self._flat(op.units, "grad")) / n
            self.shard_grads[op.units] = self.shard_grads.get(op.units, 0) + mine
            if self.grads_sharded:  # gradients live only as the shard
                for u in op.units:
                    for p in self.unit_params[u]:
                        p.grad = None
        elif op.op == "allgather" and op.payload == "params":
            full = self.comm.ring_all_gather(self.shards[op.units].detach(), self._flat(op.units, "data").numel(),
                                             self.group)
            self._unflatten_into(op.units, full, "data")
        else:
            raise SimparError(f"--compare-real: the executor cannot perform {op.op} of {op.payload} yet")

    def _copy(self, op: Copy) -> None:
        """Offload: reduced gradient shards down to the host, updated parameter shards back."""
        if op.src == "gpu" and op.dst == "host" and op.payload == "grads":
            moved = self.shard_grads.pop(op.units).clone()
            self.host_grads[op.units] = self.host_grads.get(op.units, 0) + moved
            self.copied += moved.numel() * moved.element_size()
        elif op.src == "host" and op.dst == "gpu" and op.payload == "params":
            self.copied += sum(shard.numel() * shard.element_size() for shard in self.shards.values())
        else:
            raise SimparError(f"--compare-real: the executor cannot copy {op.payload} {op.src}->{op.dst} yet")

    def _step(self) -> None:
        if self.sharded:
            grads = self.host_grads if self.host_grads else self.shard_grads
            for units, shard in self.shards.items():
                shard.grad = grads.pop(units)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)


def run_rank(ctx, scenario: Scenario, steps: int, seed: int) -> dict:
    torch.manual_seed(seed)
    executor = RankExecutor(ctx, scenario, seed)
    losses = [executor.step(step) for step in range(steps)]
    if executor.params_sharded:  # parameters stay sharded after the step: gather
        final = CountingComm(ctx.rank)  # them to report, outside the counted traffic
        for units, shard in executor.shards.items():
            numel = executor._flat(units, "data").numel()
            executor._unflatten_into(units, final.ring_all_gather(shard.detach(), numel, executor.group), "data")
    if isinstance(executor.model, TensorParallelModel):
        whole = gather_full_parameters(executor.model, CountingComm(ctx.rank), executor.tp_group)
        params = {u: whole[u] for u in executor.held}
    else:
        params = {u: torch.cat([p.detach().reshape(-1) for p in executor.unit_params[u]]) for u in executor.held}
    return {"losses": losses, "params": params, "bytes_sent": executor.comm.sent,
            "bytes_received": executor.comm.received, "offload_bytes": executor.copied}


def single_process(scenario: Scenario, steps: int, seed: int) -> dict:
    """The reference: one process, the whole global batch, the same optimizer."""
    spec, train = scenario.model, scenario.train
    model = build_model(spec, seed)
    optimizer = make_optimizer(train.optimizer, model.parameters())
    losses = []
    for step in range(steps):
        ids, targets = synthetic_batch(spec, train.global_batch, step, seed)
        loss = model.loss(ids, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": {u: torch.cat([p.detach().reshape(-1) for p in unit.parameters()])
                                         for u, unit in enumerate(model.units)}}
