"""A rank's model states held the way its Plan says, so their bytes can be measured and compared:
parameters, gradients, optimizer states, and where each lives (GPU, host, NVMe).

- ZeRO-1/2: each bucket's parameters are views of one flat buffer, and the rank's shard (what its
  optimizer updates) is a view of that buffer too; ZeRO-1 keeps full gradients, ZeRO-2 only the
  reduced shard.
- ZeRO-3: only the shard persists; a unit's parameters are views of the gathered buffer while in
  use and are freed where the Plan frees them.
- Offload: the CPU keeps its own fp32 copy of the shard (with mixed precision, the master weights),
  the gradient shards copied down and the optimizer states; ZeRO-Infinity keeps the shard and the
  optimizer states in files (``NVMeStore``) between uses.
- Unsharded strategies (dp, ddp, pp and tp without dp) keep every parameter a rank holds in one
  flat buffer too, so the optimizer steps one tensor, as fused optimizers do.
- Mixed precision (bf16): weights, gradients and traffic in bf16, fp32 master weights in the
  optimizer (counted with it, as K = 12 for Adam counts them).

Whether a state is sharded is read from the Plan: it allocates less than the whole.
"""

from __future__ import annotations

import torch

from simpar.plan import Copy, Program
from simpar.real.nvme import NVMeStore
from simpar.scenario import Scenario

LEARNING_RATE = 1e-3


def make_optimizer(name: str, params):
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(params, lr=LEARNING_RATE)
    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9 if name == "sgd-momentum" else 0.0)


def fresh_state(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state the optimizer would create at its first step (zeros), made up front (and, for
    ZeRO-Infinity, put on NVMe from the start). SGD's momentum from zeros equals torch's first-step
    copy of the gradient."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param)}
    if optimizer.defaults.get("momentum"):
        return {"momentum_buffer": torch.zeros_like(param)}
    return {}


def module_parameters(unit: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """A unit's parameters grouped by the submodule that owns them, in registration order (the
    modules ModelSpec.unit_modules lists)."""
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for name, p in unit.named_parameters():
        groups.setdefault(name.split(".")[0], []).append(p)
    return list(groups.values())


def _name(what: str, units: tuple[int, ...]) -> str:
    return f"{what}-units{units[0]}-{units[-1]}"


class ModelStates:
    def __init__(self, unit_params: list[list[torch.nn.Parameter]], held: list[int], program: Program,
                 scenario: Scenario, buckets: list[tuple[int, ...]], group_size: int, index: int, rank: int,
                 modules: list[list[list[torch.nn.Parameter]]] | None = None):
        self.unit_params, self.held, self.n, self.index = unit_params, held, group_size, index
        self.params = [p for u in held for p in unit_params[u]]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.shapes = {id(p): p.shape for params in unit_params for p in params}
        self.mixed = scenario.train.mixed
        whole = scenario.train.weight_bytes * sum(p.numel() for p in self.params)
        self.grads_sharded = program.kept_bytes("grads") < whole  # live only as the reduced shard
        self.params_sharded = program.kept_bytes("params") < whole  # no rank holds the updated whole
        # ZeRO-3 by module: each unit's modules' parameters, every module sharded alone (one rank: none is)
        self.modules = modules if self.params_sharded else None
        self.offload = any(isinstance(op, Copy) for op in program.ops)
        self.nvme = NVMeStore(rank) if any(isinstance(op, Copy) and "nvme" in (op.src, op.dst)
                                           for op in program.ops) else None
        self.copied = 0  # offload bytes between "GPU", host and NVMe tensors
        self.shards: dict[tuple[int, ...], torch.Tensor] = {}  # this rank's chunk of each bucket
        self.host_shards: dict[tuple[int, ...], torch.nn.Parameter] = {}  # offload: the CPU's copy
        self.shard_grads: dict[tuple[int, ...], torch.Tensor] = {}
        self.secondary: dict[tuple[int, ...], torch.Tensor] = {}  # ZeRO++ hpZ: chunks of the node's partition
        self.host_grads: dict[tuple[int, ...], torch.Tensor] = {}
        for units in buckets:
            flat = self.flat(units, "data")
            chunk = self._chunk(units, flat)
            if self.params_sharded:  # ZeRO-3: the shard alone; the whole is gathered when used
                self.shards[units] = chunk.clone()
                self.release(units)
            else:  # parameters become views of one flat buffer; the shard is a view too
                self.unflatten(units, flat, "data", view=True)
                self.shards[units] = chunk
            if self.offload:  # the CPU's fp32 copy (with mixed precision: the master weights), in host memory
                self.host_shards[units] = torch.nn.Parameter(chunk.detach().to("cpu", torch.float32, copy=True))
        self.sharded = bool(buckets)
        if not buckets and self.params:  # unsharded: every parameter held lives in one flat buffer, so
            flat = self.flat(held, "data")  # the optimizer steps one tensor, as fused optimizers do
            self.unflatten(held, flat, "data", view=True)
            self.shards[tuple(held)] = flat  # "this rank's chunk" is then everything it holds
        # What the optimizer updates: the shards (in fp32: the shards themselves, so views write straight
        # into the parameters' buffer; mixed precision: fp32 master copies of them).
        self.optimized = self.host_shards or {u: torch.nn.Parameter(s.float() if self.mixed else s)
                                              for u, s in self.shards.items()}
        self.optimizer = make_optimizer(scenario.train.optimizer, list(self.optimized.values()))
        for param in self.optimized.values():  # allocated up front, as DeepSpeed and FSDP do, so the first
            self.optimizer.state[param] = fresh_state(self.optimizer, param)  # step holds what all hold
        if self.nvme is not None:  # ZeRO-Infinity: shards and optimizer states start out on NVMe
            for units, param in self.host_shards.items():
                self.nvme.write(_name("params", units), {"shard": param.detach()})
                self.nvme.write(_name("states", units), self.optimizer.state.pop(param))
                param.data = torch.empty(0)
            self.shards.clear()

    # -- flat views of units ------------------------------------------------------------------
    def flat(self, units, what: str) -> torch.Tensor:
        """The units' parameters (``data``) or gradients (``grad``, none yet: nothing) as one tensor."""
        tensors = [getattr(p, what) for u in units for p in self.unit_params[u]]
        return torch.cat([t.reshape(-1) for t in tensors if t is not None] or [self.params[0].new_zeros(0)])

    def numel(self, units) -> int:
        return sum(self.shapes[id(p)].numel() for u in units for p in self.unit_params[u])

    # -- ZeRO-3 by module: a unit's shard is its modules' chunks, one after another -------------
    def pieces(self, units) -> list[int]:
        """Elements of each separately sharded piece of a bucket: its modules, or the bucket whole."""
        if self.modules is None:
            return [self.numel(units)]
        return [sum(self.shapes[id(p)].numel() for p in module) for u in units for module in self.modules[u]]

    def _chunk_len(self, numel: int) -> int:
        """Elements of this rank's torch.tensor_split chunk of ``numel`` elements."""
        return numel // self.n + (self.index < numel % self.n)

    def _chunk(self, units, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of ``flat`` (the bucket's elements): torch.tensor_split chunk of each piece."""
        pieces = self.pieces(units)
        if len(pieces) == 1:
            return torch.tensor_split(flat, self.n)[self.index]
        return torch.cat([torch.tensor_split(piece, self.n)[self.index] for piece in torch.split(flat, pieces)])

    def module_shard(self, unit: int, module: int) -> torch.Tensor:
        lengths = [self._chunk_len(numel) for numel in self.pieces((unit,))]
        start = sum(lengths[:module])
        return self.shard_to_report((unit,))[start:start + lengths[module]]

    def module_numel(self, unit: int, module: int) -> int:
        return self.pieces((unit,))[module]

    def gathered_module(self, unit: int, module: int, full: torch.Tensor) -> None:
        offset = 0
        for p in self.modules[unit][module]:
            numel = self.shapes[id(p)].numel()
            p.data = full[offset:offset + numel].view(self.shapes[id(p)])
            offset += numel

    def release_module(self, unit: int, module: int) -> None:
        for p in self.modules[unit][module]:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def gather_whole(self, comm, units, group: list[int]) -> torch.Tensor:
        """The bucket's whole parameters from every rank's shard (for reporting: not the Plan's traffic)."""
        shard, whole, start = self.shard_to_report(units).detach(), [], 0
        for numel in self.pieces(units):
            length = self._chunk_len(numel)
            whole.append(comm.ring_all_gather(shard[start:start + length].contiguous(), numel, group))
            start += length
        return torch.cat(whole)

    def unflatten(self, units, flat: torch.Tensor, what: str, view: bool = False) -> None:
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

    def release(self, units) -> None:
        """ZeRO-3: drop the units' gathered parameters (autograd keeps the Parameter objects, whose
        data is gathered again before backward)."""
        for u in units:
            for p in self.unit_params[u]:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    # -- what collectives leave behind --------------------------------------------------------
    def reduced(self, units, flat: torch.Tensor, mine: torch.Tensor) -> None:
        """A bucket's gradients were reduce-scattered (``flat`` the scratch, ``mine`` this rank's
        averaged chunk): keep the shard alone, or (ZeRO-1) put it back into the full gradients."""
        if self.grads_sharded:
            self.shard_grads[units] = self.shard_grads.get(units, 0) + mine
            for u in units:
                for p in self.unit_params[u]:
                    p.grad = None
        else:
            torch.tensor_split(flat, self.n)[self.index].copy_(mine)
            self.unflatten(units, flat, "grad")

    def gathered(self, units, full: torch.Tensor) -> None:
        self.unflatten(units, full, "data", view=self.params_sharded)
        if self.nvme is not None:  # the shard read from NVMe has served its gather
            del self.shards[units]

    def shard_to_report(self, units) -> torch.Tensor:
        """The rank's current parameter shard of ``units``, wherever it lives."""
        if self.nvme is not None:
            return self.nvme.read(_name("params", units))["shard"]
        return self.shards[units]

    # -- offload ------------------------------------------------------------------------------
    def copy(self, op: Copy) -> None:
        """Offload: reduced gradient shards down to the host, updated parameter shards back up;
        ZeRO-Infinity: parameter shards and optimizer states to and from NVMe."""
        route = (op.src, op.dst, op.payload.split()[0])
        every = [op.units] if op.units else list(self.host_shards)
        if route == ("gpu", "host", "grads"):
            moved = self.shard_grads.pop(op.units).to("cpu", copy=True)
            self.host_grads[op.units] = self.host_grads.get(op.units, 0) + moved
            self.copied += moved.numel() * moved.element_size()
        elif route == ("host", "gpu", "params"):
            for units in every:
                self.shards[units].copy_(self.host_shards[units].detach())
                self.copied += self.shards[units].numel() * self.shards[units].element_size()
        elif route == ("nvme", "gpu", "params"):  # read for the all-gather, dropped after it
            self.shards[op.units] = self.nvme.read(_name("params", op.units))["shard"].to(self.device)
            self.copied += self.shards[op.units].numel() * self.shards[op.units].element_size()
        elif route[:2] in (("nvme", "host"), ("host", "nvme")):
            for units in every:
                self._nvme_copy(route, units)
        else:
            raise ValueError(f"cannot copy {op.payload} {op.src}->{op.dst}")

    def _nvme_copy(self, route: tuple[str, str, str], units) -> None:
        param = self.host_shards[units]
        if route == ("nvme", "host", "params"):
            param.data = self.nvme.read(_name("params", units))["shard"]
            self.copied += param.numel() * param.element_size()
        elif route[:2] == ("nvme", "host"):
            self.optimizer.state[param] = self.nvme.read(_name("states", units))
            self.copied += self.nvme.held[_name("states", units)]
        elif route[2] == "params":
            self.copied += self.nvme.write(_name("params", units), {"shard": param.detach()})
            param.data = torch.empty(0)
        else:
            self.copied += self.nvme.write(_name("states", units), self.optimizer.state.pop(param))

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> None:
        for units, param in self.optimized.items():
            if self.offload:
                grad = self.host_grads.pop(units)
            elif self.grads_sharded:
                grad = self.shard_grads.pop(units)
            elif self.sharded:  # ZeRO-1: this rank's chunk of the (reduced) full gradients
                grad = torch.tensor_split(self.flat(units, "grad"), self.n)[self.index]
            else:
                grad = self.flat(units, "grad")
            param.grad = grad.to(param.dtype)  # mixed precision: bf16 gradients onto fp32 masters
        self.optimizer.step()
        if self.optimized and not self.offload:  # the shard was updated apart from the parameters' buffer
            for units, param in self.optimized.items():
                if param.data_ptr() != self.shards[units].data_ptr():
                    self.shards[units].copy_(param.detach())
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None

    # -- what is held -------------------------------------------------------------------------
    def held_now(self) -> dict:
        """Tensors held now by (memory, category), as the Plan names them."""
        grads = [p.grad for p in self.params]
        held: dict = {}
        if self.params_sharded:  # gathered whole units are communication buffers
            held[("gpu", "params")] = list(self.shards.values()) + list(self.secondary.values())
            held[("gpu", "buffers")] = list(self.params)
        else:
            held[("gpu", "params")], held[("gpu", "buffers")] = list(self.params), []
        if self.grads_sharded:  # a full gradient lives only until its bucket is reduced
            shards = list(self.shard_grads.values())  # offload: only until copied to the host
            held[("gpu", "grads")] = [] if self.offload else shards
            held[("gpu", "buffers")] += grads + (shards if self.offload else [])
        else:
            held[("gpu", "grads")] = grads
        states = [t for state in self.optimizer.state.values() for name, t in state.items() if name != "step"]
        if self.offload:  # the CPU's copy of the shard: with mixed precision the master weights, part of K
            cpu_copy = list(self.host_shards.values())
            held[("host", "optimizer")] = states + (cpu_copy if self.mixed else [])
            held[("host", "params")] = [] if self.mixed else cpu_copy
            held[("host", "grads")] = list(self.host_grads.values())
        else:  # mixed precision: fp32 master weights (of the shard, or of every parameter)
            held[("gpu", "optimizer")] = states + (list(self.optimized.values()) if self.mixed else [])
        if self.nvme is not None:  # what the CPU holds only while it steps, and what rests on NVMe
            held[("host", "buffers")] = held.pop(("host", "params")) + held.pop(("host", "optimizer"))
            held[("gpu", "buffers")] += list(self.shards.values())
            held[("gpu", "params")] = []
            held[("nvme", "params")] = self.nvme.nbytes("params")
            held[("nvme", "optimizer")] = self.nvme.nbytes("states")
        return held

    def close(self) -> None:
        if self.nvme is not None:
            self.nvme.close()
