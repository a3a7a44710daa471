"""A real decoder transformer built from a ModelSpec, small enough to read in one sitting.

Its parameters match ``ModelSpec.params`` exactly, and it is organised in the simulator's
*units* (0: embedding, 1..L: blocks, L+1: final norm + head) so the executor can shard, gather
and place parameters unit by unit. With tied embeddings the head reuses unit 0's weight.
Models without learned positions get no positional signal here (rotary embeddings have no
parameters and do not change the work being measured).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from simpar.models import ModelSpec
from simpar.real.moe import MoEBlock


def _norm(spec: ModelSpec) -> nn.Module:
    return nn.LayerNorm(spec.hidden) if spec.norm == "layernorm" else nn.RMSNorm(spec.hidden)


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.positions = nn.Embedding(spec.positions, spec.hidden) if spec.positions else None
        self.position_ids: torch.Tensor | None = None  # context parallelism: the rank's tokens' places

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is not None:
            places = torch.arange(ids.shape[1]) if self.position_ids is None else self.position_ids
            x = x + self.positions(places.to(ids.device))
        return x


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, kv, f, bias = spec.hidden, spec.kv_dim, spec.ffn, spec.bias
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.n_kv_heads, spec.head_dim
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.q, self.k, self.v = nn.Linear(h, h, bias), nn.Linear(h, kv, bias), nn.Linear(h, kv, bias)
        self.o = nn.Linear(h, h, bias)
        self.swiglu = spec.activation == "swiglu"
        self.up = nn.Linear(h, f, bias)
        self.gate = nn.Linear(h, f, bias) if self.swiglu else None
        self.down = nn.Linear(f, h, bias)
        self.attend = None  # context parallelism: attention over the whole sequence from this rank's part

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(self.heads_output(x))

    def heads_output(self, x: torch.Tensor) -> torch.Tensor:
        """Attention up to (not including) the output projection: (b, s, heads x head_dim)."""
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.attend is not None:
            return self.attend(q, k, v).transpose(1, 2).reshape(b, s, -1)
        if self.kv_heads != self.heads:  # grouped-query attention: each kv head serves a group
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, s, -1)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.mlp_hidden(x))

    def mlp_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP up to (not including) its down projection."""
        if self.swiglu:
            return F.silu(self.gate(x)) * self.up(x)
        return F.gelu(self.up(x), approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    def __init__(self, spec: ModelSpec, embedding: Embedding):
        super().__init__()
        self.norm = _norm(spec)
        self.out = None if spec.tied_embeddings else nn.Linear(spec.hidden, spec.vocab, bias=False)
        self._tied = [embedding]  # a list, so the tied weight is not registered twice
        self.logits = F.linear  # (zero-bubble schedules route it through their split backward: weight_grad.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        weight = self._tied[0].tokens.weight if self.out is None else self.out.weight
        return self.logits(x, weight)


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        embedding = Embedding(spec)
        blocks = [MoEBlock(spec, Block(spec)) if spec.unit_kind(1 + i) == "moe" else Block(spec)
                  for i in range(spec.layers)]
        self.units = nn.ModuleList([embedding, *blocks, Head(spec, embedding)])
        for module in self.modules():  # GPT-2's initialisation: small weights keep the first loss near ln(vocab)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = ids
        for unit in self.units:
            x = unit(x)
        return x

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(ids)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(spec: ModelSpec, seed: int = 0) -> GPT:
    """The same initial weights on every rank and in the single-process reference."""
    torch.manual_seed(seed)
    return GPT(spec)


def synthetic_batch(spec: ModelSpec, sequences: int, step: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets for one step's global batch, from a seed."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.randint(0, spec.vocab, (sequences, spec.seq + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]
