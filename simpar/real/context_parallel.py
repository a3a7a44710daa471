"""Context parallelism, performed: each rank of a cp group holds s / cp of every sequence and attention reaches
the others' tokens by ring attention or Ulysses, with real sends (strategies/context.py prices the same).

Ring: rank r holds the sequence's chunks r and 2cp-1-r of 2cp (zig-zag: every rank the same share of the causal
mask). Forward keeps its queries and passes its key/value block round the ring (cp - 1 exchanges), merging each
block's attention into the output by an online softmax (running log-sum-exp); it saves only its own Q, K, V,
output and log-sum-exp. Backward passes the blocks round again, recomputes each block's probabilities from the
saved log-sum-exp, adds to its dQ, and sends each visiting block's dK/dV partial sums on with the blocks: they
reach their owner after cp - 1 exchanges.

Ulysses: rank r holds contiguous chunk r; an all-to-all gives each rank all s tokens of heads / cp of Q, K and V,
attention runs whole (causal) on them, and an all-to-all returns the context; autograd runs the inverse
all-to-alls backward (the all-to-all is its own transpose).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class ContextParallel:
    def __init__(self, comm, group: list[int], rank: int, algo: str, seq: int):
        self.comm, self.group, self.algo = comm, group, algo
        self.n, self.index = len(group), group.index(rank)
        # every rank's places in the sequence (ring: to mask the blocks that visit), this rank's
        self.all_positions = [ContextParallel._positions_of(i, self.n, seq, algo) for i in range(self.n)]
        self.positions = self.all_positions[self.index]

    @classmethod
    def install(cls, model, comm, grid, rank: int, scenario) -> "ContextParallel":
        """Make ``model`` attend through the cp group and place its tokens where the sequence has them."""
        context = cls(comm, list(grid.group(rank, "cp")), rank, scenario.strategy.cp_algo, scenario.model.seq)
        for block in model.units[1:-1]:
            block.attend = context.attend
        model.units[0].position_ids = context.positions
        return context

    def take(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of each sequence (b, s) -> (b, s / cp)."""
        return tokens[:, self.positions]

    @staticmethod
    def _positions_of(index: int, n: int, seq: int, algo: str) -> torch.Tensor:
        if algo == "ring":
            chunk = seq // (2 * n)
            return torch.cat([torch.arange(index * chunk, (index + 1) * chunk),
                              torch.arange((2 * n - 1 - index) * chunk, (2 * n - index) * chunk)])
        length = seq // n
        return torch.arange(index * length, (index + 1) * length)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of this rank's queries (b, heads, s/cp, d) over the whole sequence, from its own keys
        and values (b, kv heads, s/cp, d); returns (b, heads, s/cp, d)."""
        if self.algo == "ring":
            return _RingAttention.apply(q, k, v, self)
        return self._ulysses(q, k, v)

    # -- Ulysses ------------------------------------------------------------------------------
    def _ulysses(self, q, k, v):
        b, heads, length, d = q.shape
        kv_heads, n = k.shape[1], self.n
        # what goes to rank g: its heads / cp of Q, K and V for this rank's tokens, packed as one buffer
        packed = torch.cat([t.reshape(b, n, t.shape[1] // n, length, d) for t in (q, k, v)], dim=2)
        received = _AllToAll.apply(packed.transpose(0, 1).contiguous(), self)  # (n sources, b, h/n + 2kv/n, s/n, d)
        whole = received.permute(1, 2, 0, 3, 4).reshape(b, -1, n * length, d)  # the sources' tokens in order
        q_heads, kv_local = heads // n, kv_heads // n
        qh, kh, vh = whole.split([q_heads, kv_local, kv_local], dim=1)
        if kv_local != q_heads:
            kh, vh = (t.repeat_interleave(q_heads // kv_local, dim=1) for t in (kh, vh))
        y = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)  # (b, h/n, s, d)
        back = y.reshape(b, q_heads, n, length, d).permute(2, 0, 1, 3, 4).contiguous()  # to each token's owner
        mine = _AllToAll.apply(back, self)  # (n head groups, b, h/n, s/n, d)
        return mine.permute(1, 0, 2, 3, 4).reshape(b, heads, length, d)

    # -- ring exchanges -------------------------------------------------------------------------
    def shift(self, tensor: torch.Tensor) -> torch.Tensor:
        """Send ``tensor`` to the next rank of the ring; return what the previous one sent."""
        received = torch.empty_like(tensor)
        following, previous = self.group[(self.index + 1) % self.n], self.group[(self.index - 1) % self.n]
        self.comm._exchange(tensor.contiguous(), following, received, previous)
        return received


class _AllToAll(torch.autograd.Function):
    """(n, ...) pieces, piece g for rank g -> (n, ...), piece g from rank g; backward the same on the gradient."""

    @staticmethod
    def forward(ctx, pieces, context):
        ctx.context = context
        return torch.stack(context.comm.all_to_all(list(pieces.unbind(0)), context.group))

    @staticmethod
    def backward(ctx, grad):
        context = ctx.context
        return torch.stack(context.comm.all_to_all(list(grad.contiguous().unbind(0)), context.group)), None


def _block(q, k, v, q_pos, k_pos, scale):
    """One block's masked scores (fp32) with its keys repeated for grouped-query attention."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    masked = q_pos[:, None] < k_pos[None, :]
    return scores.masked_fill(masked, float("-inf")), v, group


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cp: ContextParallel):
        scale = 1.0 / math.sqrt(q.shape[-1])
        out, lse = None, None
        kv = torch.stack([k, v])
        for step in range(cp.n):
            source = (cp.index - step) % cp.n
            if step:
                kv = cp.shift(kv)
            scores, values, _ = _block(q, kv[0], kv[1], cp.positions, cp.all_positions[source], scale)
            block_lse = torch.logsumexp(scores, dim=-1)  # -inf where a query sees none of the block
            probs = torch.exp(scores - block_lse.nan_to_num(neginf=0.0)[..., None])
            block_out = probs @ values.float()
            if out is None:
                out, lse = block_out, block_lse
            else:
                merged = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - merged)[..., None] + block_out * torch.exp(block_lse - merged)[..., None]
                lse = merged
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp, ctx.scale = cp, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        cp, scale = ctx.cp, ctx.scale
        grad_out = grad_out.float()
        delta = (grad_out * out).sum(-1)  # the softmax backward's row term
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv, carried, own = torch.stack([k, v]), None, None
        for step in range(cp.n):
            source = (cp.index - step) % cp.n
            if step:
                kv = cp.shift(kv)
            scores, values, group = _block(q, kv[0], kv[1], cp.positions, cp.all_positions[source], scale)
            probs = torch.exp(scores - lse[..., None])
            d_values = probs.transpose(-1, -2) @ grad_out
            d_scores = probs * (grad_out @ values.float().transpose(-1, -2) - delta[..., None])
            dq += d_scores @ _repeat(kv[0], group).float() * scale
            d_keys = d_scores.transpose(-1, -2) @ q.float() * scale
            dkv = torch.stack([_fold(d_keys, group), _fold(d_values, group)])
            if step == 0:
                own = dkv  # this rank's block: its own share, kept until the others' come home
            elif step == 1:
                carried = dkv  # the first visitor starts the block's partial sums, which travel on with it
            else:
                carried = cp.shift(carried) + dkv
        if cp.n > 1:
            own = own + cp.shift(carried)  # the partial sums of this rank's block, home
        return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype), None


def _repeat(t, group):
    return t.repeat_interleave(group, dim=1) if group > 1 else t


def _fold(t, group):
    """A repeated key/value head's gradient summed back onto the head (grouped-query attention)."""
    if group == 1:
        return t
    b, heads, length, d = t.shape
    return t.reshape(b, heads // group, group, length, d).sum(2)
