"""Sequence parallelism for the executor (Korthikanti et al. 2022), over the tensor-parallel slices.

Between the parallel regions each TP rank holds only its s/t positions of the sequence (rank i the
i-th block): norms, residual adds and biases run on that block. A parallel region starts with an
all-gather of the normed block (the whole sequence, for the column-parallel GEMMs) and ends with a
reduce-scatter of its partial output (summed over the TP group, each rank keeping its block).
Backward mirrors it: the gradient of a reduce-scatter is an all-gather, and the reverse. The
vocabulary-parallel embedding's partial sums are reduce-scattered; the head gathers its normed
input and scatters the gradient back. The norms' and row-parallel biases' gradients saw only the
rank's block, so the Plan all-reduces them over the TP group after the backward.

The executor performs the Plan's collectives: each piece returns a ``Reduction`` whose ``op`` is
``gather`` or ``scatter`` (the sequence blocks) or ``sum`` / ``max`` (the cross-entropy). A unit's
backward starts with the all-gather of its output gradient (``output_gradient``).
"""

from __future__ import annotations

import torch

from simpar.real.model import GPT
from simpar.real.tensor_parallel import Reduction, TensorParallelModel, _bias, _leaf


def gather_sequence(comm, local: torch.Tensor, group: list[int]) -> torch.Tensor:
    """(b, s/t, h) blocks of every rank -> (b, s, h): a ring all-gather over the sequence."""
    blocks = local.transpose(0, 1).contiguous()  # sequence-major, so rank i's block is chunk i
    whole = comm.ring_all_gather(blocks.reshape(-1), blocks.numel() * len(group), group)
    return whole.view(len(group) * blocks.shape[0], *blocks.shape[1:]).transpose(0, 1)


def scatter_sequence(comm, partial: torch.Tensor, group: list[int]) -> torch.Tensor:
    """(b, s, h) partial sums -> this rank's summed (b, s/t, h) block: a ring reduce-scatter."""
    blocks = partial.transpose(0, 1).contiguous()
    mine = comm.ring_reduce_scatter(blocks.reshape(-1), group)
    return mine.view(blocks.shape[0] // len(group), *blocks.shape[1:]).transpose(0, 1)


class SequenceParallelModel(TensorParallelModel):
    """TensorParallelModel's slices, run with sequence parallelism: a layer is four pieces per phase
    (attention norm, attention, MLP norm, MLP), the head two (norm, logits), the embedding one."""

    def __init__(self, full: GPT, index: int, parts: int):
        super().__init__(full, index, parts)
        self.index, self.parts = index, parts

    def pieces(self, unit: int) -> int:
        return 4 if 0 < unit < len(self.units) - 1 else (2 if unit == len(self.units) - 1 else 1)

    # -- forward --------------------------------------------------------------------------------
    def forward_piece(self, unit: int, mb: int, half: int, x, targets, scale: float, outputs: dict):
        module, key = self.units[unit], (unit, mb)
        if unit == 0:
            return self._embedding_forward(module, key, x, outputs)
        if unit == len(self.units) - 1:
            if half == 0:
                state = self.saved[key] = {"n": module.norm(x)}
                return Reduction(state["n"].detach(), "gather", lambda whole: state.update(n_leaf=_leaf(whole)))
            return self._cross_entropy(module, key, targets, scale, outputs)
        if half == 0:
            state = self.saved[key] = {"x": x, "a": module.norm1(x)}
            return Reduction(state["a"].detach(), "gather", lambda whole: state.update(a_leaf=_leaf(whole)))
        state = self.saved[key]
        if half == 1:
            state["partial"] = module.attention_partial(state["a_leaf"])

            def after_attention(block):
                state["s_leaf"] = _leaf(block)
                state["h"] = state["x"] + state["s_leaf"] + _bias(module.o)
            return Reduction(state["partial"].detach(), "scatter", after_attention)
        if half == 2:
            state["b"] = module.norm2(state["h"])
            return Reduction(state["b"].detach(), "gather", lambda whole: state.update(b_leaf=_leaf(whole)))
        state["partial2"] = module.mlp_partial(state["b_leaf"])

        def after_mlp(block):
            state["out"] = outputs[key] = state["h"] + _leaf(block) + _bias(module.down)
        return Reduction(state["partial2"].detach(), "scatter", after_mlp)

    def _embedding_forward(self, module, key, ids, outputs):
        partial = module.partial(ids)
        state = self.saved[key] = {"partial": partial}

        def after_scatter(block):
            state["s_leaf"] = out = _leaf(block)
            if module.positions is not None:  # this rank's positions of the sequence
                first = self.index * block.shape[1]
                out = out + module.positions(torch.arange(first, first + block.shape[1], device=ids.device))
            state["out"] = outputs[key] = out
        return Reduction(partial.detach(), "scatter", after_scatter)

    # -- backward -------------------------------------------------------------------------------
    def output_gradient(self, unit: int, mb: int, grad: torch.Tensor) -> Reduction:
        """The all-gather a layer's or the embedding's backward starts with: its output gradient's blocks."""
        state = self.saved[(unit, mb)]
        state["grad"] = grad
        return Reduction(grad, "gather", lambda whole: state.update(grad_whole=whole))

    def backward_piece(self, unit: int, mb: int, half: int, grad):
        key = (unit, mb)
        state = self.saved[key]
        if unit == 0:
            del self.saved[key]
            state["out"].backward(state["grad"])  # the positions' gradient, this rank's block
            state["partial"].backward(state["grad_whole"])
            return None
        if unit == len(self.units) - 1:
            if half == 0:
                self._cross_entropy_backward(state)
                return Reduction(state["n_leaf"].grad, "scatter", lambda block: state.update(grad_n=block))
            del self.saved[key]
            state["n"].backward(state["grad_n"])
            return None
        if half == 0:  # MLP
            state["partial2"].backward(state["grad_whole"])
            return Reduction(state["b_leaf"].grad, "scatter", lambda block: state.update(grad_b=block))
        if half == 1:  # MLP norm, and the residual
            torch.autograd.backward([state["out"], state["b"]], [state["grad"], state["grad_b"]])
            return Reduction(state["s_leaf"].grad, "gather", lambda whole: state.update(grad_s=whole))
        if half == 2:  # attention
            state["partial"].backward(state["grad_s"])
            return Reduction(state["a_leaf"].grad, "scatter", lambda block: state.update(grad_a=block))
        del self.saved[key]  # attention norm
        state["a"].backward(state["grad_a"])
        return None
