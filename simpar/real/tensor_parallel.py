"""Megatron tensor parallelism for the executor: one TP rank's slice of the model, run in the
pieces the Plan names so each all-reduce is a separate, counted, timed op.

Slicing (Shoeybi et al. 2019): Q, K, V and the MLP's up/gate are column-parallel (output rows
and biases split: each rank owns heads/t heads and ffn/t columns); O and MLP down are
row-parallel (input columns split, bias added once after the all-reduce); the embedding and the
head are vocabulary-parallel; norms and positions stay whole. A rank's weights are cut from the
same seeded full model the single-process reference trains, so results can be compared.

Autograd cannot pause in the middle of a backward for a counted all-reduce, so each unit is
cut where Megatron communicates: forward computes a *partial* sum (detached), the executor
all-reduces it over the TP group and hands the sum back to ``then``; backward first propagates
to the detached input of the parallel region, the executor all-reduces that partial input
gradient, and ``then`` finishes through the replicated norm and residual. Cheap element-wise
finishing work (residual adds, the norm's backward, the cross-entropy's exp) runs inside the
all-reduce op's ``then``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simpar.real.model import GPT, Block, Embedding, Head


@dataclass
class Reduction:
    """A tensor to all-reduce over the TP group (``op`` sum or max), and what to do with the result."""

    tensor: torch.Tensor
    op: str
    then: Callable[[torch.Tensor], Reduction | None]


def _leaf(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().requires_grad_()


def _rows(linear: nn.Linear, index: int, parts: int) -> nn.Linear:
    """Column-parallel: this rank's output features (rows of the weight) and their bias."""
    weight = torch.tensor_split(linear.weight.detach(), parts, dim=0)[index]
    part = nn.Linear(weight.shape[1], weight.shape[0], linear.bias is not None)
    part.weight.data.copy_(weight)
    if linear.bias is not None:
        part.bias.data.copy_(torch.tensor_split(linear.bias.detach(), parts)[index])
    return part


def _columns(linear: nn.Linear, index: int, parts: int) -> nn.Linear:
    """Row-parallel: this rank's input features (columns of the weight); the bias stays whole and is
    added once after the all-reduce."""
    weight = torch.tensor_split(linear.weight.detach(), parts, dim=1)[index]
    part = nn.Linear(weight.shape[1], weight.shape[0], linear.bias is not None)
    part.weight.data.copy_(weight)
    if linear.bias is not None:
        part.bias.data.copy_(linear.bias.detach())
    return part


# Which dimension of each parameter is split across TP ranks (None: replicated), by name.
SPLIT_DIMS = {"tokens.weight": 0, "out.weight": 0, "q.weight": 0, "q.bias": 0, "k.weight": 0, "k.bias": 0,
              "v.weight": 0, "v.bias": 0, "up.weight": 0, "up.bias": 0, "gate.weight": 0, "gate.bias": 0,
              "o.weight": 1, "down.weight": 1}


class ParallelEmbedding(nn.Module):
    def __init__(self, full: Embedding, index: int, parts: int):
        super().__init__()
        rows = torch.tensor_split(full.tokens.weight.detach(), parts)[index]
        self.start = sum(t.shape[0] for t in torch.tensor_split(full.tokens.weight, parts)[:index])
        self.tokens = nn.Embedding(rows.shape[0], rows.shape[1])
        self.tokens.weight.data.copy_(rows)
        self.positions = full.positions  # replicated, added after the all-reduce

    def partial(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the lookup: its vocabulary slice's embeddings, zeros for other tokens."""
        rows = self.tokens.weight.shape[0]
        local = ids - self.start
        inside = (local >= 0) & (local < rows)
        return self.tokens(local.clamp(0, rows - 1)) * inside.unsqueeze(-1)


class ParallelBlock(nn.Module):
    def __init__(self, full: Block, index: int, parts: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = full.heads // parts, full.kv_heads // parts, full.head_dim
        self.norm1, self.norm2 = full.norm1, full.norm2
        self.q, self.k, self.v = (_rows(full.q, index, parts), _rows(full.k, index, parts),
                                  _rows(full.v, index, parts))
        self.o = _columns(full.o, index, parts)
        self.swiglu = full.swiglu
        self.up = _rows(full.up, index, parts)
        self.gate = _rows(full.gate, index, parts) if full.swiglu else None
        self.down = _columns(full.down, index, parts)
        self.attend = None  # Block.heads_output's hook: context parallelism is not combined with TP here

    def attention_partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's heads (the same code as the full block, fewer heads), projected without bias."""
        return F.linear(Block.heads_output(self, x), self.o.weight)

    def mlp_partial(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(Block.mlp_hidden(self, x), self.down.weight)


class ParallelHead(nn.Module):
    def __init__(self, full: Head, embedding: ParallelEmbedding, index: int, parts: int):
        super().__init__()
        self.norm = full.norm
        self.out = None
        if full.out is not None:
            rows = torch.tensor_split(full.out.weight.detach(), parts)[index]
            self.out = nn.Linear(rows.shape[1], rows.shape[0], bias=False)
            self.out.weight.data.copy_(rows)
        self._tied = [embedding]  # a list, so a tied weight is not registered twice
        self.start = embedding.start

    @property
    def weight(self) -> torch.Tensor:
        return self._tied[0].tokens.weight if self.out is None else self.out.weight


def _bias(linear: nn.Linear):
    return 0 if linear.bias is None else linear.bias


class TensorParallelModel(nn.Module):
    """One TP rank's units, run piece by piece (see the module docstring).

    ``forward_piece`` / ``backward_piece`` take the Plan's compute op of a unit (``half`` 0 or 1:
    attention, then MLP in forward, the reverse in backward) and return the Reduction that the
    Plan's next TP all-reduce performs, or None. Outputs land in the ``outputs`` dict the caller
    passes; input gradients accumulate in the ``.grad`` of the input leaf the caller passed.
    """

    def __init__(self, full: GPT, index: int, parts: int):
        super().__init__()
        embedding = ParallelEmbedding(full.units[0], index, parts)
        blocks = [ParallelBlock(block, index, parts) for block in full.units[1:-1]]
        self.units = nn.ModuleList([embedding, *blocks, ParallelHead(full.units[-1], embedding, index, parts)])
        self.saved: dict[tuple[int, int], dict] = {}
        self.loss_total = 0.0
        self.on_hold = None  # (key, tensor): told of tensors kept for backward outside autograd

    # -- forward --------------------------------------------------------------------------------
    def forward_piece(self, unit: int, mb: int, half: int, x, targets, scale: float, outputs: dict):
        module, key = self.units[unit], (unit, mb)
        if unit == 0:
            return self._embedding_forward(module, key, x, outputs)
        if unit == len(self.units) - 1:
            return self._head_forward(module, key, x, targets, scale, outputs)
        if half == 0:
            a = module.norm1(x)
            state = self.saved[key] = {"x": x, "a": a, "a_leaf": _leaf(a)}
            state["partial"] = module.attention_partial(state["a_leaf"])

            def after_attention(summed):
                state["s_leaf"] = _leaf(summed)
                state["h"] = x + state["s_leaf"] + _bias(module.o)
            return Reduction(state["partial"].detach(), "sum", after_attention)
        state = self.saved[key]
        b = module.norm2(state["h"])
        state["b"], state["b_leaf"] = b, _leaf(b)
        state["partial2"] = module.mlp_partial(state["b_leaf"])

        def after_mlp(summed):
            state["out"] = outputs[key] = state["h"] + _leaf(summed) + _bias(module.down)
        return Reduction(state["partial2"].detach(), "sum", after_mlp)

    def _embedding_forward(self, module: ParallelEmbedding, key, ids, outputs):
        partial = module.partial(ids)
        state = self.saved[key] = {"partial": partial}

        def after_sum(summed):
            state["s_leaf"] = _leaf(summed)
            out = state["s_leaf"]
            if module.positions is not None:
                out = out + module.positions(torch.arange(ids.shape[1], device=ids.device))
            state["out"] = outputs[key] = out
        return Reduction(partial.detach(), "sum", after_sum)

    def _head_forward(self, module: ParallelHead, key, x, targets, scale, outputs):
        n = module.norm(x)
        self.saved[key] = {"n": n, "n_leaf": _leaf(n)}
        return self._cross_entropy(module, key, targets, scale, outputs)

    def _cross_entropy(self, module: ParallelHead, key, targets, scale, outputs):
        """The vocabulary-parallel logits and cross-entropy of the normed ``n_leaf`` (Megatron)."""
        state = self.saved[key]
        state["scale"] = scale
        z = state["z"] = F.linear(state["n_leaf"], module.weight).float()
        if self.on_hold is not None:
            self.on_hold(key, z)
        rows = z.shape[-1]
        local = targets - module.start
        inside = (local >= 0) & (local < rows)
        state["target"], state["inside"] = local.clamp(0, rows - 1), inside

        def after_max(maximum):  # the vocabulary-parallel cross-entropy (Megatron)
            exp = torch.exp(z.detach() - maximum.unsqueeze(-1))
            logit = z.detach().gather(-1, state["target"].unsqueeze(-1)).squeeze(-1) * inside

            def after_sums(sums):
                state["probs"] = exp / sums[0].unsqueeze(-1)
                if self.on_hold is not None:
                    self.on_hold(key, state["probs"])
                loss = (torch.log(sums[0]) + maximum - sums[1]).mean() * scale
                self.loss_total += float(loss)
                outputs[key] = loss
            return Reduction(torch.stack([exp.sum(-1), logit]), "sum", after_sums)
        return Reduction(z.detach().amax(-1), "max", after_max)

    # -- backward -------------------------------------------------------------------------------
    def backward_piece(self, unit: int, mb: int, half: int, grad):
        key = (unit, mb)
        state = self.saved[key]
        if unit == 0:  # the all-reduce's gradient is the identity: no communication
            del self.saved[key]
            state["out"].backward(grad)
            state["partial"].backward(state["s_leaf"].grad)
            return None
        if unit == len(self.units) - 1:
            self._cross_entropy_backward(state)

            def after_head(summed):
                del self.saved[key]
                state["n"].backward(summed)
            return Reduction(state["n_leaf"].grad, "sum", after_head)
        if half == 0:  # MLP first
            state["grad"] = grad
            state["partial2"].backward(grad)

            def after_mlp(summed):
                torch.autograd.backward([state["out"], state["b"]], [state["grad"], summed])
            return Reduction(state["b_leaf"].grad, "sum", after_mlp)
        state["partial"].backward(state["s_leaf"].grad)

        def after_attention(summed):
            del self.saved[key]
            state["a"].backward(summed)
        return Reduction(state["a_leaf"].grad, "sum", after_attention)


    @staticmethod
    def _cross_entropy_backward(state: dict) -> None:
        """Softmax minus the one-hot target, back through the logits to ``n_leaf``."""
        probs = state["probs"]
        probs.scatter_add_(-1, state["target"].unsqueeze(-1), -state["inside"].unsqueeze(-1).to(probs.dtype))
        state["z"].backward(probs * (state["scale"] / probs[..., 0].numel()))

    def pieces(self, unit: int) -> int:
        """Compute ops the Plan splits a unit into, per phase."""
        return 2 if 0 < unit < len(self.units) - 1 else 1

    def replicated_parameters(self, units) -> list[torch.Tensor]:
        """The parameters of ``units`` that every TP rank holds whole, in a fixed order."""
        return [p for u in units for name, p in self.units[u].named_parameters()
                if ".".join(name.split(".")[-2:]) not in SPLIT_DIMS]


def gather_full_parameters(model: TensorParallelModel, comm, group: list[int]) -> list[torch.Tensor]:
    """Each unit's parameters reassembled from the TP ranks' slices, flattened in the full model's
    order (for comparing with one process; the traffic is not part of the Plan's)."""
    flats = []
    for unit in model.units:
        pieces = []
        for name, p in unit.named_parameters():
            dim = SPLIT_DIMS.get(".".join(name.split(".")[-2:]))
            if dim is None:
                pieces.append(p.detach().reshape(-1))
                continue
            moved = p.detach().movedim(dim, 0).contiguous()
            whole = comm.ring_all_gather(moved.reshape(-1), moved.numel() * len(group), group)
            pieces.append(whole.view(len(group) * moved.shape[0], *moved.shape[1:]).movedim(0, dim).reshape(-1))
        flats.append(torch.cat(pieces).float())  # numpy (the way home) has no bf16
    return flats
