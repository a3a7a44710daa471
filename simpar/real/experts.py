"""Expert parallelism performed for real: an MoE layer's three parts (real/moe.py) with the Plan's
all-to-alls between them (strategies/experts.py), on one rank of an ep group holding experts / ep of
each layer's experts.

Each part is its own autograd graph, joined by detached leaves where data crosses ranks: forward keeps
the "attn" part's outputs (the residual h1, the normed z, the routing weights, the dispatch buffer), the
buffer's chunks go to the ranks holding their experts, the experts' outputs come back to be combined;
backward sends the gradients the same way in reverse and finishes with the "attn" part's backward from
all four of its outputs' gradients. The gradient of an expert sums the contributions of the ep ranks'
tokens; summed again over the ranks holding the same expert (edp) and divided by dp, it is the whole
batch's mean, as one process computes it.
"""

from __future__ import annotations

import torch
from torch import nn

from simpar.real.moe import MoEBlock, Routing, run_experts


class ExpertParallel:
    def __init__(self, model: nn.Module, rank: int, group: list[int]):
        self.group, self.index = group, group.index(rank)
        self.blocks = {u: unit for u, unit in enumerate(model.units) if isinstance(unit, MoEBlock)}
        self.local = next(iter(self.blocks.values())).spec.experts // len(group)
        for block in self.blocks.values():  # this rank keeps its own experts only
            block.experts = nn.ModuleList(list(block.experts)[self.index * self.local:(self.index + 1) * self.local])
        self.state: dict = {}  # (unit, micro-batch) -> the tensors between parts

    def is_split(self, unit: int) -> bool:
        return unit in self.blocks

    def expert_parameters(self, unit: int) -> list[nn.Parameter]:
        return list(self.blocks[unit].experts.parameters()) if unit in self.blocks else []

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, unit: int, mb: int, part: str, x: torch.Tensor | None) -> torch.Tensor | None:
        block, state = self.blocks[unit], self.state.setdefault((unit, mb), {})
        if part == "attn":
            h1, z, routing, buffer = block.attend(x)
            state["attn"] = (h1, z, routing.weight, buffer)
            state["leaves"] = [t.detach().requires_grad_() for t in (h1, z, routing.weight)]
            state["routing"] = Routing(routing.expert, routing.slot, routing.kept, state["leaves"][2])
            state["send"] = list(buffer.detach().split(self.local))
        elif part == "experts":
            state["rows"] = state.pop("received")
            state["out"] = run_experts(block.experts, state["rows"])
            state["send"] = list(state["out"].detach().unbind(0))
        else:  # combine
            h1, z, _ = state["leaves"]
            state["combined"] = state.pop("received")
            return block.finish(h1, z, state["routing"], state["combined"])
        return None

    def alltoall(self, comm, unit: int, mb: int, payload: str) -> None:
        """Perform the Plan's all-to-all: send this rank's chunks, keep what arrives for the next part."""
        state = self.state[(unit, mb)]
        arrived = comm.all_to_all([c.contiguous() for c in state.pop("send")], self.group)
        if payload in ("dispatch", "combine grads"):  # my experts' rows from every rank: (ep, local, b, slots, h)
            state["received"] = torch.stack(arrived).requires_grad_(payload == "dispatch")
        else:  # every expert's rows of my tokens, in expert order: (experts, b, slots, h)
            state["received"] = torch.cat(arrived).requires_grad_(payload == "combine")

    # -- backward ---------------------------------------------------------------------------------
    def backward(self, unit: int, mb: int, part: str, output, grad: torch.Tensor | None) -> None:
        state = self.state[(unit, mb)]
        if part == "combine":
            combined = state.pop("combined")
            output.backward(grad)
            state["send"] = list(combined.grad.split(self.local))
        elif part == "experts":
            state.pop("out").backward(state.pop("received"))
            state["send"] = list(state.pop("rows").grad.unbind(0))
        else:  # attn: from all four outputs' gradients
            outputs, leaves = state["attn"], state["leaves"]
            pairs = [(o, leaf.grad) for o, leaf in zip(outputs, leaves) if leaf.grad is not None]
            pairs.append((outputs[3], state.pop("received")))
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            del self.state[(unit, mb)]

    def full_parameters(self, comm, unit: int, params: list[nn.Parameter]) -> torch.Tensor:
        """A unit's parameters in the single process's order, the experts gathered from the ep group."""
        experts = {id(p) for p in self.expert_parameters(unit)}
        dense = [p.detach().float().reshape(-1) for p in params if id(p) not in experts]
        mine = torch.cat([p.detach().float().reshape(-1) for p in self.expert_parameters(unit)])
        return torch.cat(dense + [comm.ring_all_gather(mine, mine.numel() * len(self.group), self.group)])

    def reduce(self, comm, op, unit_params: list[list[nn.Parameter]], group: list[int], n: int, edp: int) -> None:
        """A data-parallel all-reduce of gradients under expert parallelism: "grads" the units' parameters but
        the experts (over dp), "expert grads" the experts (over edp). Every gradient ends divided by dp n: the
        experts' sum the ep ranks' tokens already, so with edp = 1 they are only divided."""
        experts = {id(p) for u in op.units for p in self.expert_parameters(u)}
        mine = op.group == "edp"
        comm.all_reduce_grads([p for u in op.units for p in unit_params[u] if (id(p) in experts) == mine], group,
                              1 / n)
        if not mine and edp == 1:
            for u in op.units:
                for p in self.expert_parameters(u):
                    p.grad.div_(n)


def check_moe_supported(scenario) -> None:
    """What the executor performs of MoE, ZeRO++ and hsdp; anything else one error naming the flag."""
    from simpar.errors import SimparError

    model, spec = scenario.model, scenario.strategy
    if model.experts and model.capacity_factor is None:
        raise SimparError(f"--capacity-factor: the executor pads each expert's buffer to a capacity; {model.name} "
                          "routes without one: give --capacity-factor (e.g. 1.25)")
    if model.experts and spec.tp > 1:
        raise SimparError("--tp: the executor runs MoE layers without tensor parallelism (simulated only)")
    if spec.ep > 1 and spec.name != "ddp":
        raise SimparError(f"--ep: the executor performs expert parallelism with --strategy ddp, not {spec.name}")
    if spec.ep > 1 and (spec.recompute != "none" or spec.algo not in (None, "ring")):
        raise SimparError("--ep: the executor runs expert parallelism without recomputation, with ring all-reduces")
    if spec.ep > 1 and spec.alltoall_algo != "pairwise":
        raise SimparError("--a2a-algo: the executor performs the pairwise all-to-all")
