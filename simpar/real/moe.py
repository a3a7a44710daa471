"""A real Mixture-of-Experts layer (models/moe.py's routing), whole on one process or split into the three
parts expert parallelism runs between its all-to-alls (real/experts.py).

Routing: the router's logits (hidden -> experts), each token's top_k experts, their softmax as the weights
(Mixtral's). Every sequence routes on its own: a token copy takes the next slot of its expert's buffer in
the order (choice, token), GShard's priority to first choices; copies past the expert's ``slots`` are
dropped (they add nothing to the output). The buffer is (experts, sequences, slots, hidden), zeros where no
copy landed; padding rows pass through the experts but are never combined, so they add nothing to any
gradient either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simpar.models import ModelSpec
from simpar.models.moe import slots


class Expert(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, f, bias = spec.hidden, spec.expert_width, spec.bias
        self.swiglu = spec.activation == "swiglu"
        self.up = nn.Linear(h, f, bias)
        self.gate = nn.Linear(h, f, bias) if self.swiglu else None
        self.down = nn.Linear(f, h, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.gate(x)) * self.up(x) if self.swiglu else F.gelu(self.up(x), approximate="tanh")
        return self.down(hidden)


@dataclass
class Routing:
    """Where each token copy went: its expert, slot, whether it was kept, and its weight (b, s, k each)."""

    expert: torch.Tensor
    slot: torch.Tensor
    kept: torch.Tensor
    weight: torch.Tensor


def route(spec: ModelSpec, router: nn.Linear, z: torch.Tensor, imbalance: float = 1.0) -> Routing:
    b, s, _ = z.shape
    logits = router(z).float()
    top, expert = logits.topk(spec.top_k, dim=-1)  # (b, s, k)
    weight = top.softmax(dim=-1).to(z.dtype)
    order = expert.transpose(1, 2).reshape(b, spec.top_k * s)  # choice-major: first choices first
    onehot = F.one_hot(order, spec.experts)
    position = (onehot.cumsum(dim=1) - 1).gather(2, order.unsqueeze(-1)).squeeze(-1)
    slot = position.view(b, spec.top_k, s).transpose(1, 2)
    return Routing(expert, slot, slot < slots(spec, imbalance), weight)


def dispatch(spec: ModelSpec, z: torch.Tensor, routing: Routing, imbalance: float = 1.0) -> torch.Tensor:
    """The (experts, b, slots, hidden) buffer of the kept copies of z's tokens."""
    b, s, h = z.shape
    buffer = z.new_zeros(spec.experts, b, slots(spec, imbalance), h)
    seq = torch.arange(b, device=z.device).view(b, 1, 1).expand_as(routing.expert)
    token = torch.arange(s, device=z.device).view(1, s, 1).expand_as(routing.expert)
    k = routing.kept
    return buffer.index_put((routing.expert[k], seq[k], routing.slot[k]), z[seq[k], token[k]])


def combine(outputs: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Each token's kept copies' expert outputs, weighted and summed: (b, s, hidden)."""
    b = outputs.shape[1]
    seq = torch.arange(b, device=outputs.device).view(b, 1, 1).expand_as(routing.expert)
    slot = routing.slot.clamp(max=outputs.shape[2] - 1)
    picked = outputs[routing.expert, seq, slot]  # (b, s, k, hidden)
    weight = routing.weight * routing.kept.to(routing.weight.dtype)
    return (picked * weight.unsqueeze(-1)).sum(dim=2)


def run_experts(experts: nn.ModuleList, buffer: torch.Tensor) -> torch.Tensor:
    """Each expert on its rows of ``buffer`` (its experts along dim 0 or 1: (..., experts, b, slots, h))."""
    dim = buffer.dim() - 4
    return torch.stack([e(x) for e, x in zip(experts, buffer.unbind(dim))], dim=dim)


class MoEBlock(nn.Module):
    """A transformer layer whose MLP is experts. Registration order (ModelSpec.unit_modules("moe")): the
    attention's modules, the router, the shared experts, the routed experts."""

    def __init__(self, spec: ModelSpec, attention_block: nn.Module):
        super().__init__()
        self.spec = spec
        for name in ("norm1", "norm2", "q", "k", "v", "o"):
            setattr(self, name, getattr(attention_block, name))
        self._attention = [attention_block]  # its heads_output, not registered twice
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.shared = nn.ModuleList(Expert(spec) for _ in range(spec.shared_experts)) if spec.shared_experts else None
        self.experts = nn.ModuleList(Expert(spec) for _ in range(spec.experts))
        # without a capacity factor every copy fits: an expert takes at most a sequence's every token
        self.imbalance = 1.0 if spec.capacity_factor is not None else spec.experts / spec.top_k
        self.routed = self.dropped = 0  # token copies the router sent here, and those past their capacity

    def attend(self, x: torch.Tensor):
        """The "attn" part: (h1, z, routing, dispatch buffer)."""
        h1 = x + self.o(self._attention[0].heads_output(self.norm1(x)))
        z = self.norm2(h1)
        routing = route(self.spec, self.router, z, self.imbalance)
        self.routed += routing.kept.numel()
        self.dropped += int((~routing.kept).sum())
        return h1, z, routing, dispatch(self.spec, z, routing, self.imbalance)

    def finish(self, h1: torch.Tensor, z: torch.Tensor, routing: Routing, outputs: torch.Tensor) -> torch.Tensor:
        """The "combine" part."""
        y = h1 + combine(outputs, routing)
        if self.shared is not None:
            y = y + sum(e(z) for e in self.shared)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1, z, routing, buffer = self.attend(x)
        return self.finish(h1, z, routing, run_experts(self.experts, buffer))
