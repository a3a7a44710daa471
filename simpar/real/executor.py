"""Perform a Plan for real: each rank walks its Program's ops and does them with real tensors.

Ops are performed in the order the strategy wrote them (every op's dependencies come earlier),
so streams do not overlap here; what is real is the work: per-unit forward and backward with
autograd, collectives as counted point-to-point sends of the Plan's algorithm, the optimizer
step on the whole model or on the rank's shard, offload copies between "GPU" and host tensors.

Parameters, gradients and optimizer states are held the way the Plan says (``states.py``), and
what a rank measures (op times, bytes per memory and category) is recorded as it goes
(``instrument.py``); tensor-parallel units run piece by piece (``tensor_parallel.py``), expert-parallel MoE
layers part by part with their all-to-alls (``experts.py``), and ZeRO++'s and hsdp's collectives are
``zeropp.py``'s.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from simpar.errors import SimparError
from simpar.plan import Alloc, Collective, Compute, Copy, Free, Recv, Send, op_label
from simpar.real.comm import CountingComm, NativeComm, message_tag
from simpar.real.context_parallel import ContextParallel
from simpar.real.experts import ExpertParallel
from simpar.real.moe import MoEBlock
from simpar.real.support import check_supported
from simpar.real.weight_grad import WeightGrads, split_linears
from simpar.real.zeropp import ShardedCollectives
from simpar.real.instrument import Recorder, SavedActivations
from simpar.real.model import build_model, synthetic_batch
from simpar.real.states import ModelStates, make_optimizer, module_parameters
from simpar.real.sequence_parallel import SequenceParallelModel, gather_sequence, scatter_sequence
from simpar.real.tensor_parallel import TensorParallelModel, gather_full_parameters
from simpar.scenario import Scenario
from simpar.strategies import build_plan
from simpar.strategies.pipeline import SPLIT_BACKWARD

class RankExecutor:
    def __init__(self, ctx, scenario: Scenario, seed: int, collectives: str = "explicit"):
        check_supported(scenario)
        self.ctx, self.scenario, self.seed = ctx, scenario, seed
        self.plan = build_plan(scenario)
        self.program = self.plan.program_of(ctx.rank)
        self.model = build_model(scenario.model, seed)
        grid = self.plan.grid
        self.tp_group = list(grid.group(ctx.rank, "tp"))
        if grid.tp > 1:  # this rank's slice of the same seeded model
            parallel = SequenceParallelModel if scenario.strategy.sequence_parallel else TensorParallelModel
            self.model = parallel(self.model, self.tp_group.index(ctx.rank), grid.tp)
        self.mixed = scenario.train.mixed  # bf16 weights, gradients and traffic; fp32 master weights
        self.dtype = torch.bfloat16 if self.mixed else torch.float32
        # nccl: the GPU launch (or torchrun's LOCAL_RANK) made current; gloo: the CPU
        gpu = ctx.backend == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
        # expert parallelism: this rank keeps its experts of each MoE layer
        self.experts = ExpertParallel(self.model, ctx.rank, list(grid.group(ctx.rank, "ep"))) if grid.ep > 1 else None
        self.model.to(self.device, self.dtype)
        self.weight_grads = WeightGrads() if scenario.strategy.schedule in SPLIT_BACKWARD else None
        if self.weight_grads is not None:  # zero-bubble schedules: B's input gradients, W's weight gradients
            split_linears(self.model, self.weight_grads)
        self.reduction = None  # TP: what the Plan's next TP collective sums, gathers or scatters
        # TP: the forward or backward op run last, and when its reduction's continuation started (the work
        # completing a piece after its all-reduce is that piece's compute: ``_tensor_parallel``)
        self.last_compute: Compute | None = None
        self.finishing: float | None = None
        self.unit_params = [list(unit.parameters()) for unit in self.model.units]
        if collectives == "native":
            kinds = [grid.group(r, kind) for kind in ("dp", "tp") for r in range(grid.world)]
            self.comm = NativeComm(ctx.rank, sorted(set(kinds)))
        else:
            self.comm = CountingComm(ctx.rank)
        self.group = list(grid.group(ctx.rank, "dp"))
        self.index = self.group.index(ctx.rank) // grid.cp  # this rank's share of the batch
        # context parallelism: this rank's part of each sequence, attention over the whole
        self.context = ContextParallel.install(self.model, self.comm, grid, ctx.rank, scenario) if grid.cp > 1 else None
        held = sorted({op.unit for op in self.program.ops if isinstance(op, Compute) and op.unit >= 0})
        buckets = self.program.zero_buckets()
        modules = None
        if scenario.strategy.name == "zero3" and scenario.gather_granularity == "module":
            modules = [module_parameters(unit) for unit in self.model.units]
        spec = scenario.strategy  # hsdp shards over the shard group; ZeRO++ and hsdp's calls: real/zeropp.py
        self.state_group = list(grid.group(ctx.rank, "shard")) if spec.name == "hsdp" else self.group
        self.states = ModelStates(self.unit_params, held, self.program, scenario, buckets, len(self.state_group),
                                  self.state_group.index(ctx.rank), ctx.rank, modules)
        self.sharded = (ShardedCollectives(self.comm, self.states, grid, ctx.rank, spec)
                        if spec.name == "hsdp" or spec.zeropp else None)
        self.pending_sends: list = []
        self.next_compute: dict[int, tuple[int, int]] = {}  # op id -> (unit, micro-batch) of the next compute
        upcoming = None
        for op in reversed(self.program.ops):
            self.next_compute[op.id] = upcoming
            if isinstance(op, Compute) and op.phase in ("fwd", "bwd"):
                upcoming = (op.unit, op.microbatch)
        self.recorder = Recorder(self.device)
        # each op's name for a fault message, made once: the label is set at every op of every step
        self.labels = {op.id: f"op {op.id}: {op_label(op)}" for op in self.program.ops}
        self.activations = SavedActivations(self.model.parameters())
        if isinstance(self.model, TensorParallelModel):  # its cross-entropy keeps logits and probabilities itself
            self.model.on_hold = lambda key, tensor: self.activations.hold(key, tensor) if self.instrumented else None

    def _sample(self) -> None:
        if not self.instrumented:
            return
        held = self.states.held_now()
        held[("gpu", "activations")] = self.activations.nbytes
        if self.weight_grads is not None:
            held[("gpu", "temporaries")] = self.weight_grads.held_bytes()
        self.recorder.sample(held)

    def step(self, step: int) -> float:
        """One training step; returns this rank's share of its loss (``mean_losses`` sums the shares
        once the steps are done). Memory is sampled (after every op, and autograd's saved tensors seen
        through hooks) during the first step only: every step holds the same, and the sampling would
        cost more than a tiny model's ops, so later steps, whose times are reported, run without it."""
        self.instrumented = step == 0
        spec, train = self.scenario.model, self.scenario.train
        m, b = self.scenario.microbatches, train.micro_batch
        ids, targets = (t.to(self.device) for t in synthetic_batch(spec, train.global_batch, step, self.seed))
        inputs: dict = {}
        outputs: dict = {}
        grad_out: dict = {}  # gradients of a chunk's output, received from the next stage
        loss_total = 0.0
        pieces: dict = defaultdict(int)  # (unit, micro-batch, phase) -> compute ops seen (TP: halves)
        self.recorder.start_step()
        for op in self.program.ops:
            started = self.recorder.clock()
            with self.ctx.op(f"step {step} {self.labels[op.id]}"):
                if (isinstance(op, Free) and op.units and op.payload.startswith("params")
                        and self.states.params_sharded):  # (on one rank ZeRO-3 holds everything)
                    if op.modules:
                        self.states.release_module(op.units[0], op.modules[0])
                    else:
                        self.states.release(op.units)
                if isinstance(op, (Alloc, Free)):
                    self._sample()
                    continue
                if isinstance(op, Compute) and op.phase in ("fwd", "bwd"):
                    half = pieces[(op.unit, op.microbatch, op.phase)]
                    pieces[(op.unit, op.microbatch, op.phase)] += 1
                    rows = slice((self.index * m + op.microbatch) * b, (self.index * m + op.microbatch + 1) * b)
                    mine = [t[rows] if self.context is None else self.context.take(t[rows]) for t in (ids, targets)]
                    if self.context is not None and half:  # the layer ran whole, exchanges and all, at its first piece
                        pass
                    elif op.phase == "fwd":
                        loss_total += self._forward(op, half, *mine, inputs, outputs)
                    else:
                        self._backward(op, half, inputs, outputs, grad_out)
                    self.last_compute = op
                elif isinstance(op, Collective):
                    if op.group == "tp" and self.reduction is None and op.payload.startswith("output grads"):
                        # sequence parallelism: a unit's backward starts by gathering its output gradient
                        unit, mb = self.next_compute[op.id]
                        self.reduction = self.model.output_gradient(unit, mb, self._output_grad(unit, mb, inputs,
                                                                                                grad_out))
                    self._collective(op)
                elif isinstance(op, Compute) and op.phase == "step":
                    self.states.step()
                elif isinstance(op, Copy):
                    self.states.copy(op)
                elif isinstance(op, (Send, Recv)):
                    self._p2p(op, inputs, outputs, grad_out)
                else:
                    raise SimparError(f"--compare-real: the executor cannot perform {op!r} yet")
                if self.finishing is not None:  # the call, then the piece's continuation as that piece's compute
                    self.recorder.time_op(op, started, until=self.finishing)
                    self.recorder.time_op(self.last_compute or op, self.finishing)
                    self.finishing = None
                else:
                    self.recorder.time_op(op, started)
                self._sample()
        for request in self.pending_sends:
            request.wait()
        self.pending_sends.clear()
        self.recorder.end_step()
        if isinstance(self.model, TensorParallelModel):
            loss_total, self.model.loss_total = self.model.loss_total, 0.0
        return loss_total

    def _forward(self, op: Compute, half: int, ids, targets, inputs: dict, outputs: dict) -> float:
        """Forward of one unit (TP: one piece of it) on one micro-batch; returns its share of the loss."""
        key, m = (op.unit, op.microbatch), self.scenario.microbatches
        if half == 0:
            inputs[key] = ids if op.unit == 0 else outputs[(op.unit - 1, op.microbatch)].detach().requires_grad_()
        if self.experts is not None and self.experts.is_split(op.unit):  # an MoE layer's part
            with self.activations.hooks(key) if self.instrumented else nullcontext():
                out = self.experts.forward(op.unit, op.microbatch, op.part, inputs[key] if half == 0 else None)
            if out is not None:
                outputs[key] = out
            return 0.0
        if isinstance(self.model, TensorParallelModel):
            with self.activations.hooks(key) if self.instrumented else nullcontext():
                self.reduction = self.model.forward_piece(op.unit, op.microbatch, half, inputs[key], targets,
                                                          1 / m, outputs)
            return 0.0
        unit = self.model.units[op.unit]
        head = op.unit == len(self.model.units) - 1
        with self.activations.hooks(key) if self.instrumented else nullcontext():
            if self.scenario.strategy.recompute == "full" and 0 < op.unit < len(self.model.units) - 1:
                out = checkpoint(unit, inputs[key], use_reentrant=False)  # keeps only the layer's input
            else:
                out = unit(inputs[key])
            if head:  # mean over the micro-batch, scaled to the step's mean; what the loss saves is the head's
                out = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), targets.reshape(-1)) / m
        if head:
            outputs[key] = out
            return float(out.detach())
        outputs[key] = out
        return 0.0

    def _backward(self, op: Compute, half: int, inputs: dict, outputs: dict, grad_out: dict) -> None:
        key, head = (op.unit, op.microbatch), op.unit == len(self.model.units) - 1
        if op.part == "/weight":  # W: the weight gradients its B left
            return self.weight_grads.compute(key)
        grad = None
        sequence_parallel = isinstance(self.model, SequenceParallelModel)  # the gradient came with a gather
        if half == 0 and not head and not sequence_parallel:
            grad = self._output_grad(op.unit, op.microbatch, inputs, grad_out)
        if self.experts is not None and self.experts.is_split(op.unit):
            self.experts.backward(op.unit, op.microbatch, op.part, outputs.pop(key) if half == 0 else None, grad)
            if op.part == "attn":
                self.activations.release(key)
            return
        if isinstance(self.model, TensorParallelModel):
            self.reduction = self.model.backward_piece(op.unit, op.microbatch, half, grad)
            if half == self.model.pieces(op.unit) - 1:
                self.activations.release(key)
            return
        with self.weight_grads.deferring(key) if op.part.endswith("/input") else nullcontext():
            outputs.pop(key).backward(grad)
        self.activations.release(key)

    @staticmethod
    def _output_grad(unit: int, mb: int, inputs: dict, grad_out: dict):
        """The gradient of a unit's output: received from the next stage, or the next unit's input's."""
        key = (unit, mb)
        return grad_out.pop(key) if key in grad_out else inputs.pop((unit + 1, mb)).grad

    def _tensor_parallel(self, op: Collective) -> None:
        """Perform the Plan's TP collective on the pending partial result (sum or max: all-reduce;
        sequence parallelism: gather or scatter the sequence blocks); its continuation may leave the
        next one (the cross-entropy's maxima, then sums). The continuation (residual adds, a norm's
        backward) is timed apart from the call (``finishing``) and counted with the piece it completes, as
        the simulator prices it with the piece's compute; counted in the call, tp's backward read 30-70 %
        short of its price and its collectives long, the step alike."""
        if op.payload == "sequence-parallel grads":
            return self._sequence_parallel_grads()
        reduction, self.reduction = self.reduction, None
        expected = {"sum": "allreduce", "max": "allreduce", "gather": "allgather", "scatter": "reducescatter"}
        if reduction is None or expected[reduction.op] != op.op:
            raise SimparError(f"--compare-real: the Plan's TP {op.op} ({op.payload}) does not match the model's "
                              f"{'nothing' if reduction is None else reduction.op} here")
        if reduction.op == "gather":
            result = gather_sequence(self.comm, reduction.tensor, self.tp_group)
        elif reduction.op == "scatter":
            result = scatter_sequence(self.comm, reduction.tensor, self.tp_group)
        else:
            flat = reduction.tensor.reshape(-1).clone()
            result = self.comm.ring_all_reduce(flat, self.tp_group, reduction.op).view_as(reduction.tensor)
        self.finishing = self.recorder.clock()
        self.reduction = reduction.then(result)

    def _sequence_parallel_grads(self) -> None:
        """Sum the gradients of the parameters every TP rank holds whole (each saw its sequence block)."""
        self.comm.all_reduce_grads(self.model.replicated_parameters(self.states.held), self.tp_group)

    def mean_losses(self, local: list[float]) -> list[float]:
        """Each step's loss from every rank's share, in one all-reduce after the last step (reporting only:
        not the Plan's traffic). Summed after each step, it was a collective the Plan does not have inside
        the timed loop: it set the ranks off into the next step a wake-up apart (at 2 ranks up to a 4 ms
        tick), and in pp the first stage's first send after it landed 1.1 ms after its isend on average
        against 0.2-0.5 ms for the step's other sends."""
        total = torch.tensor(local, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(total)
        return [float(t) / (self.plan.grid.dp * self.plan.grid.tp) for t in total]  # every TP rank holds the loss

    def _p2p(self, op, inputs: dict, outputs: dict, grad_out: dict) -> None:
        """Activations forward and their gradients back between pipeline stages."""
        peer = self.plan.grid.peer(self.ctx.rank, op.peer)
        first, last, mb = op.units[0], op.units[-1], op.microbatch
        train, spec = self.scenario.train, self.scenario.model
        if isinstance(op, Recv):
            seq = spec.seq // self.plan.grid.cp
            seq = seq // self.plan.grid.tp if self.scenario.strategy.sequence_parallel else seq
            buffer = torch.empty(train.micro_batch, seq, spec.hidden, dtype=self.dtype, device=self.device)
            self.comm.recv(buffer, peer, message_tag(op.tag))
            if op.tag.startswith("F"):
                outputs[(first - 1, mb)] = buffer  # the chunk's first unit reads it as its input
            else:
                grad_out[(last, mb)] = buffer
            return
        tensor = outputs[(last, mb)].detach() if op.tag.startswith("F") else inputs.pop((first, mb)).grad
        self.pending_sends.append(self.comm.isend(tensor.contiguous(), peer, message_tag(op.tag)))

    def _reduce(self, op: Collective, flat: torch.Tensor) -> torch.Tensor:
        if op.op == "allreduce":
            if op.algo == "ps":
                return self.comm.ps_all_reduce(flat, self.group)
            return self.comm.ring_all_reduce(flat, self.group)
        return self.comm.ring_reduce_scatter(flat, self.group)

    def _collective(self, op: Collective) -> None:
        if op.group == "tp":
            return self._tensor_parallel(op)
        n, states = len(self.group), self.states
        if op.group == "cp":  # performed inside the attention (real/context_parallel.py)
            return
        if op.group == "ep":  # (of the MoE part that follows it)
            unit, mb = self.next_compute[op.id]
            return self.experts.alltoall(self.comm, unit, mb, op.payload.rsplit(" unit", 1)[0])
        if self.sharded is not None and op.payload.startswith(("params", "grads")) and len(self.group) > 1:
            return self.sharded.perform(op)
        if self.experts is not None and op.payload in ("grads", "expert grads"):
            group = list(self.plan.grid.group(self.ctx.rank, op.group))
            return self.experts.reduce(self.comm, op, self.unit_params, group, n, self.plan.grid.edp)
        if op.op == "allreduce" and op.payload == "grads":
            states.unflatten(op.units, self._reduce(op, states.flat(op.units, "grad")) / n, "grad")
        elif op.op == "reducescatter" and op.payload == "grads":
            flat = states.flat(op.units, "grad")
            if op.pieces:  # coalesced: each module's gradients reduce-scattered on their own, in one ring
                mine = self.comm.ring_reduce_scatter_coalesced(list(torch.split(flat, states.pieces(op.units))),
                                                               self.group)
            else:
                mine = self._reduce(op, flat)
            states.reduced(op.units, flat, mine / n)
        elif op.op == "allgather" and op.payload == "params" and n == 1:
            return  # one rank: its shard is the whole
        elif op.op == "allgather" and op.payload == "params" and op.modules:
            unit, module = op.units[0], op.modules[0]
            whole = self.comm.ring_all_gather(states.module_shard(unit, module).detach(),
                                              states.module_numel(unit, module), self.group)
            states.gathered_module(unit, module, whole)
        elif op.op == "allgather" and op.payload == "params":
            shard = states.shards[op.units].detach()
            states.gathered(op.units, self.comm.ring_all_gather(shard, states.numel(op.units), self.group))
        else:
            raise SimparError(f"--compare-real: the executor cannot perform {op.op} of {op.payload} yet")


def run_rank(ctx, scenario: Scenario, steps: int, seed: int, collectives: str = "explicit") -> dict:
    """``collectives``: explicit (the Plan's algorithm as counted point-to-point sends) or native
    (the backend's own collectives, traffic not counted)."""
    torch.manual_seed(seed)
    executor = RankExecutor(ctx, scenario, seed, collectives)
    try:
        return _train(ctx, executor, steps)
    finally:
        executor.states.close()


def _train(ctx, executor: RankExecutor, steps: int) -> dict:
    shares = []
    for step in range(steps):
        shares.append(executor.step(step))
        ctx.step_done()
    losses, states = executor.mean_losses(shares), executor.states
    if states.params_sharded:  # parameters stay sharded after the step: gather
        final = CountingComm(ctx.rank)  # them to report, outside the counted traffic
        for units in states.optimized:
            states.unflatten(units, states.gather_whole(final, units, executor.state_group), "data", view=True)
    if isinstance(executor.model, TensorParallelModel):
        whole = gather_full_parameters(executor.model, CountingComm(ctx.rank), executor.tp_group)
        params = {u: whole[u] for u in states.held}
    else:
        params = {u: torch.cat([p.detach().float().reshape(-1) for p in executor.unit_params[u]])
                  for u in states.held}
    if executor.experts is not None:  # an MoE layer's experts from every rank of the ep group (not counted)
        for u in executor.experts.blocks:
            params[u] = executor.experts.full_parameters(CountingComm(ctx.rank), u, executor.unit_params[u])
    recorder = executor.recorder
    return {"losses": losses, "params": params, "bytes_sent": executor.comm.sent,
            "bytes_received": executor.comm.received, "offload_bytes": states.copied,
            "step_times": recorder.step_times, "timeline": recorder.timeline, "op_means": recorder.op_means(),
            "memory": recorder.report(), "moe_copies": _moe_copies(executor.model)}


def _moe_copies(model) -> tuple[int, int] | None:
    """(token copies routed, dropped past capacity) by this rank's MoE layers over the run; None when dense."""
    blocks = [u for u in model.units if isinstance(u, MoEBlock)]
    return (sum(b.routed for b in blocks), sum(b.dropped for b in blocks)) if blocks else None


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
