"""Perform a Plan for real: each rank walks its Program's ops and does them with real tensors.

Ops are performed in the order the strategy wrote them (every op's dependencies come earlier),
so streams do not overlap here; what is real is the work: per-unit forward and backward with
autograd, collectives as counted point-to-point sends of the Plan's algorithm, the optimizer
step on the whole model or on the rank's shard, offload copies between "GPU" and host tensors.

Model states are held the way the Plan says, so their bytes can be measured and compared:
ZeRO-1/2 parameters live in one flat buffer per bucket and a rank's optimizer shard is a view
into it; ZeRO-3 keeps only the shard and frees each unit's gathered parameters where the Plan
frees them; offload keeps the CPU's copy of the shard, its gradients and optimizer states apart.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from simpar.errors import SimparError
from simpar.plan import Alloc, Collective, Compute, Copy, Free, Recv, Send
from simpar.real.comm import CountingComm, NativeComm
from simpar.real.instrument import Recorder, SavedActivations
from simpar.real.model import build_model, synthetic_batch
from simpar.real.nvme import NVMeStore
from simpar.real.tensor_parallel import TensorParallelModel, gather_full_parameters
from simpar.scenario import Scenario
from simpar.strategies import build_plan

LEARNING_RATE = 1e-3


def _name(what: str, units: tuple[int, ...]) -> str:
    return f"{what}-units{units[0]}-{units[-1]}"


def fresh_state(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state the optimizer would create at its first step (zeros), made up front so it can
    live on NVMe from the start, as ZeRO-Infinity allocates it. SGD's momentum from zeros equals
    torch's first-step copy of the gradient."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param)}
    if optimizer.defaults.get("momentum"):
        return {"momentum_buffer": torch.zeros_like(param)}
    return {}


def make_optimizer(name: str, params):
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(params, lr=LEARNING_RATE)
    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9 if name == "sgd-momentum" else 0.0)


def check_supported(scenario: Scenario) -> None:
    """What the executor cannot perform yet, as one clear error naming the flag."""
    spec = scenario.strategy
    if spec.pp > 1 and scenario.model.tied_embeddings:
        raise SimparError(f"--model: {scenario.model.name} ties its embedding and head, which the executor "
                          "cannot split across pipeline stages yet; use an untied model")
    if spec.tp > 1 and scenario.model.vocab % spec.tp:
        raise SimparError(f"--tp: the executor splits {scenario.model.name}'s vocabulary of {scenario.model.vocab} "
                          f"evenly, which tp {spec.tp} does not divide")
    if scenario.train.precision != "fp32":
        raise SimparError("--precision: the CPU executor runs fp32 (use --precision fp32)")
    if spec.algo not in (None, "ring", "ps"):
        raise SimparError(f"--algo: the executor performs ring and ps (Worker-Server) collectives, not {spec.algo}")
    if spec.recompute == "selective" or (spec.recompute == "full" and spec.tp > 1):
        raise SimparError("--recompute: the executor recomputes whole layers (full) without tensor parallelism "
                          "only")


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
            self.model = TensorParallelModel(self.model, self.tp_group.index(ctx.rank), grid.tp)
        self.reduction = None  # TP: the partial result the Plan's next TP all-reduce sums
        self.unit_params = [list(unit.parameters()) for unit in self.model.units]
        if collectives == "native":
            kinds = [grid.group(r, kind) for kind in ("dp", "tp") for r in range(grid.world)]
            self.comm = NativeComm(ctx.rank, sorted(set(kinds)))
        else:
            self.comm = CountingComm(ctx.rank)
        self.group = list(grid.group(ctx.rank, "dp"))
        self.index = self.group.index(ctx.rank)  # this rank's share of the batch
        self.held = sorted({op.unit for op in self.program.ops if isinstance(op, Compute) and op.unit >= 0})
        self.grads_sharded = self._sharded_state("grads")  # so they live only as the reduced shard
        self.params_sharded = self._sharded_state("params")  # then no rank holds the updated whole
        self.offload = any(isinstance(op, Copy) for op in self.program.ops)
        self.nvme = NVMeStore(ctx.rank) if any(isinstance(op, Copy) and "nvme" in (op.src, op.dst)
                                               for op in self.program.ops) else None
        self.shapes = {id(p): p.shape for params in self.unit_params for p in params}
        self.pending_sends: list = []
        self.copied = 0  # offload bytes between "GPU" and "host" memory (both DRAM on a CPU run)
        self.shards: dict[tuple[int, ...], torch.Tensor] = {}  # this rank's chunk of each bucket
        self.host_shards: dict[tuple[int, ...], torch.nn.Parameter] = {}  # offload: the CPU's copy
        self.shard_grads: dict[tuple[int, ...], torch.Tensor] = {}
        self.host_grads: dict[tuple[int, ...], torch.Tensor] = {}
        buckets = list(dict.fromkeys(op.units for op in self.program.ops
                                     if isinstance(op, Collective) and op.op == "reducescatter"))
        for units in buckets:
            flat = self._flat(units, "data")
            chunk = torch.tensor_split(flat, len(self.group))[self.index]
            if self.params_sharded:  # ZeRO-3: the shard alone; the whole is gathered when used
                self.shards[units] = chunk.clone()
                self._release(units)
            else:  # parameters become views of one flat buffer; the shard is a view too
                self._unflatten_into(units, flat, "data", view=True)
                self.shards[units] = chunk
            if self.offload:
                self.host_shards[units] = torch.nn.Parameter(chunk.clone())
        optimized = self.host_shards or {u: torch.nn.Parameter(s) for u, s in self.shards.items()}
        self.optimized = optimized  # what the optimizer updates, by bucket (sharded strategies)
        self.optimizer = make_optimizer(scenario.train.optimizer,
                                        list(optimized.values()) if buckets else self.model.parameters())
        if self.nvme is not None:  # ZeRO-Infinity: shards and optimizer states start out on NVMe
            for units, param in self.host_shards.items():
                self.nvme.write(_name("params", units), {"shard": param.detach()})
                self.nvme.write(_name("states", units), fresh_state(self.optimizer, param))
                param.data = torch.empty(0)
            self.shards.clear()
        self.recorder = Recorder(torch.device("cpu"))
        self.activations = SavedActivations(self.model.parameters())

    def _sharded_state(self, category: str) -> bool:
        """Whether the Plan keeps this model state as a shard: it allocates less than the whole."""
        whole = self.scenario.train.weight_bytes * sum(p.numel() for u in self.held for p in self.unit_params[u])
        held = sum(op.nbytes for op in self.program.ops
                   if isinstance(op, Alloc) and op.category == category and op.payload == "model states"
                   and op.memory != "host")
        return held < whole

    def _flat(self, units, what: str) -> torch.Tensor:
        tensors = [getattr(p, what) for u in units for p in self.unit_params[u]]
        return torch.cat([t.reshape(-1) if t is not None else torch.zeros(0) for t in tensors])

    def _unflatten_into(self, units, flat: torch.Tensor, what: str, view: bool = False) -> None:
        """Gradients become views of ``flat``; parameters too with ``view``, else it is copied into them."""
        offset = 0
        for u in units:
            for p in self.unit_params[u]:
                numel = self.shapes[id(p)].numel()
                piece = flat[offset:offset + numel].view(self.shapes[id(p)])
                if what == "grad":
                    p.grad = piece
                elif view:
                    p.data = piece
                else:
                    p.data.copy_(piece)
                offset += numel

    def _release(self, units) -> None:
        """ZeRO-3: drop the units' gathered parameters (autograd keeps the Parameter objects, whose
        data is gathered again before backward)."""
        for u in units:
            for p in self.unit_params[u]:
                p.data = torch.empty(0, dtype=p.dtype)

    def _held(self) -> dict:
        """Tensors held now by (memory, category), as the Plan names them."""
        params = [p for u in self.held for p in self.unit_params[u]]
        grads = [p.grad for p in params]
        held: dict = {("gpu", "activations"): self.activations.nbytes}
        if self.params_sharded:  # gathered whole units are communication buffers
            held[("gpu", "params")], held[("gpu", "buffers")] = list(self.shards.values()), params
        else:
            held[("gpu", "params")], held[("gpu", "buffers")] = params, []
        if self.grads_sharded:  # a full gradient lives only until its bucket is reduced
            shards = list(self.shard_grads.values())  # offload: only until copied to the host
            held[("gpu", "grads")] = [] if self.offload else shards
            held[("gpu", "buffers")] = held[("gpu", "buffers")] + grads + (shards if self.offload else [])
        else:
            held[("gpu", "grads")] = grads
        states = [t for state in self.optimizer.state.values() for name, t in state.items() if name != "step"]
        held[("host" if self.offload else "gpu", "optimizer")] = states
        if self.offload:
            held[("host", "params")] = list(self.host_shards.values())
            held[("host", "grads")] = list(self.host_grads.values())
        if self.nvme is not None:  # what the CPU holds only while it steps, and what rests on NVMe
            held[("host", "buffers")] = held.pop(("host", "params")) + held.pop(("host", "optimizer"))
            held[("gpu", "buffers")] += list(self.shards.values())
            held[("gpu", "params")] = []
            held[("nvme", "params")], held[("nvme", "optimizer")] = self.nvme.nbytes("params"), self.nvme.nbytes("states")
        return held

    def step(self, step: int) -> float:
        spec, train = self.scenario.model, self.scenario.train
        m, b = self.scenario.microbatches, train.micro_batch
        ids, targets = synthetic_batch(spec, train.global_batch, step, self.seed)
        inputs: dict = {}
        outputs: dict = {}
        grad_out: dict = {}  # gradients of a chunk's output, received from the next stage
        loss_total = 0.0
        pieces: dict = defaultdict(int)  # (unit, micro-batch, phase) -> compute ops seen (TP: halves)
        self.recorder.start_step()
        for op in self.program.ops:
            started = self.recorder.clock()
            with self.ctx.op(f"step {step} op {op.id} {type(op).__name__} {getattr(op, 'phase', '')}"
                             f"{getattr(op, 'op', '')} unit {getattr(op, 'unit', getattr(op, 'units', ''))}"):
                if isinstance(op, Free) and op.units and op.payload.startswith("params"):
                    self._release(op.units)
                if isinstance(op, (Alloc, Free)):
                    self.recorder.sample(self._held())
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
                self.recorder.time_op(op, started)
                self.recorder.sample(self._held())
        for request in self.pending_sends:
            request.wait()
        self.pending_sends.clear()
        self.recorder.end_step()
        if isinstance(self.model, TensorParallelModel):
            loss_total, self.model.loss_total = self.model.loss_total, 0.0
        return self._mean_loss(loss_total)

    def _forward(self, op: Compute, half: int, ids, targets, inputs: dict, outputs: dict) -> float:
        """Forward of one unit (TP: one piece of it) on one micro-batch; returns its share of the loss."""
        key, m = (op.unit, op.microbatch), self.scenario.microbatches
        if half == 0:
            inputs[key] = ids if op.unit == 0 else outputs[(op.unit - 1, op.microbatch)].detach().requires_grad_()
        if isinstance(self.model, TensorParallelModel):
            with self.activations.hooks(key):
                self.reduction = self.model.forward_piece(op.unit, op.microbatch, half, inputs[key], targets,
                                                          1 / m, outputs)
            return 0.0
        unit = self.model.units[op.unit]
        with self.activations.hooks(key):
            if self.scenario.strategy.recompute == "full" and 0 < op.unit < len(self.model.units) - 1:
                out = checkpoint(unit, inputs[key], use_reentrant=False)  # keeps only the layer's input
            else:
                out = unit(inputs[key])
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
            if half == (1 if 0 < op.unit < len(self.model.units) - 1 else 0):  # its last piece
                self.activations.release(key)
            return
        outputs.pop(key).backward(grad)
        self.activations.release(key)

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
            flat = self._flat(op.units, "grad")
            mine = self._reduce(op, flat) / n
            if self.grads_sharded:  # gradients live only as the shard
                self.shard_grads[op.units] = self.shard_grads.get(op.units, 0) + mine
                for u in op.units:
                    for p in self.unit_params[u]:
                        p.grad = None
            else:  # ZeRO-1 keeps full gradients: the reduced chunk goes back into them
                torch.tensor_split(flat, n)[self.index].copy_(mine)
                self._unflatten_into(op.units, flat, "grad")
        elif op.op == "allgather" and op.payload == "params":
            full = self.comm.ring_all_gather(self.shards[op.units].detach(), self._numel(op.units), self.group)
            self._unflatten_into(op.units, full, "data", view=self.params_sharded)
            if self.nvme is not None:  # the shard read from NVMe has served its gather
                del self.shards[op.units]
        else:
            raise SimparError(f"--compare-real: the executor cannot perform {op.op} of {op.payload} yet")

    def _numel(self, units) -> int:
        return sum(self.shapes[id(p)].numel() for u in units for p in self.unit_params[u])

    def _copy(self, op: Copy) -> None:
        """Offload: reduced gradient shards down to the host, updated parameter shards back up;
        ZeRO-Infinity: parameter shards and optimizer states to and from NVMe."""
        route = (op.src, op.dst, op.payload.split()[0])
        every = [op.units] if op.units else list(self.host_shards)
        if route == ("gpu", "host", "grads"):
            moved = self.shard_grads.pop(op.units).clone()
            self.host_grads[op.units] = self.host_grads.get(op.units, 0) + moved
            self.copied += moved.numel() * moved.element_size()
        elif route == ("host", "gpu", "params"):
            for units in every:
                self.shards[units].copy_(self.host_shards[units].detach())
                self.copied += self.shards[units].numel() * self.shards[units].element_size()
        elif route == ("nvme", "gpu", "params"):  # read for the all-gather, dropped after it
            self.shards[op.units] = self.nvme.read(_name("params", op.units))["shard"]
            self.copied += self.shards[op.units].numel() * self.shards[op.units].element_size()
        elif route[:2] == ("nvme", "host"):
            for units in every:
                param = self.host_shards[units]
                if route[2] == "params":
                    param.data = self.nvme.read(_name("params", units))["shard"]
                    self.copied += param.numel() * param.element_size()
                else:
                    self.optimizer.state[param] = self.nvme.read(_name("states", units))
                    self.copied += self.nvme.held[_name("states", units)]
        elif route[:2] == ("host", "nvme"):
            for units in every:
                param = self.host_shards[units]
                if route[2] == "params":
                    self.copied += self.nvme.write(_name("params", units), {"shard": param.detach()})
                    param.data = torch.empty(0)
                else:
                    self.copied += self.nvme.write(_name("states", units), self.optimizer.state.pop(param))
        else:
            raise SimparError(f"--compare-real: the executor cannot copy {op.payload} {op.src}->{op.dst} yet")

    def _step(self) -> None:
        for units, param in self.optimized.items():
            if self.offload:
                param.grad = self.host_grads.pop(units)
            elif self.grads_sharded:
                param.grad = self.shard_grads.pop(units)
            else:  # ZeRO-1: this rank's chunk of the (reduced) full gradients
                param.grad = torch.tensor_split(self._flat(units, "grad"), len(self.group))[self.index]
        self.optimizer.step()
        if self.optimized and not self.offload:  # the shard was updated apart from the parameters' buffer
            for units, param in self.optimized.items():
                if param.data_ptr() != self.shards[units].data_ptr():
                    self.shards[units].copy_(param.detach())
        self.optimizer.zero_grad(set_to_none=True)
        self.model.zero_grad(set_to_none=True)


def run_rank(ctx, scenario: Scenario, steps: int, seed: int, collectives: str = "explicit") -> dict:
    """``collectives``: explicit (the Plan's algorithm as counted point-to-point sends) or native
    (the backend's own collectives, traffic not counted)."""
    torch.manual_seed(seed)
    executor = RankExecutor(ctx, scenario, seed, collectives)
    try:
        return _train(ctx, executor, steps)
    finally:
        if executor.nvme is not None:
            executor.nvme.close()


def _train(ctx, executor: RankExecutor, steps: int) -> dict:
    losses = []
    for step in range(steps):
        losses.append(executor.step(step))
        ctx.step_done()
    if executor.params_sharded:  # parameters stay sharded after the step: gather
        final = CountingComm(ctx.rank)  # them to report, outside the counted traffic
        for units in executor.optimized:
            shard = (executor.nvme.read(_name("params", units))["shard"] if executor.nvme is not None
                     else executor.shards[units])
            whole = final.ring_all_gather(shard.detach(), executor._numel(units), executor.group)
            executor._unflatten_into(units, whole, "data", view=True)
    if isinstance(executor.model, TensorParallelModel):
        whole = gather_full_parameters(executor.model, CountingComm(ctx.rank), executor.tp_group)
        params = {u: whole[u] for u in executor.held}
    else:
        params = {u: torch.cat([p.detach().reshape(-1) for p in executor.unit_params[u]]) for u in executor.held}
    recorder = executor.recorder
    return {"losses": losses, "params": params, "bytes_sent": executor.comm.sent,
            "bytes_received": executor.comm.received, "offload_bytes": executor.copied,
            "step_times": recorder.step_times, "timeline": recorder.timeline, "memory": recorder.report()}


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
