"""Zero-bubble schedules' split backward, performed: B computes input gradients, W weight gradients.

Every linear layer of the model (and the head's logits GEMM, tied or not) runs through ``_SplitLinear``,
whose backward returns the input's gradient at once. While a B pass runs (``WeightGrads.deferring``), it
keeps the layer's input and output gradient instead of computing the weight's gradient; W
(``WeightGrads.compute``) turns them into the weight and bias gradients and adds them to ``.grad``, as the
zero-bubble paper's implementation does (Qi et al. 2023, its WeightGradStore). Outside a B pass (every
other schedule, the single-process reference) the layer computes both gradients in one backward, exactly
like ``torch.nn.functional.linear``. Other parameters (norms, embeddings) get theirs in B: W leaves them.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from simpar.real.instrument import storage_bytes


class WeightGrads:
    """The weight gradients a B pass left, per (unit, micro-batch), until its W."""

    def __init__(self):
        self.pending: dict[tuple, list] = {}
        self._key: tuple | None = None

    @contextmanager
    def deferring(self, key: tuple):
        self._key = key
        self.pending.setdefault(key, [])
        try:
            yield
        finally:
            self._key = None

    def defer(self, weight, bias, inputs, grad_output) -> bool:
        if self._key is None:
            return False
        self.pending[self._key].append((weight, bias, inputs, grad_output))
        return True

    def compute(self, key: tuple) -> None:
        for weight, bias, inputs, grad_output in self.pending.pop(key, ()):
            weight_grad, bias_grad = _weight_grads(inputs, grad_output, bias is not None)
            _accumulate(weight, weight_grad)
            if bias is not None:
                _accumulate(bias, bias_grad)

    def held_bytes(self) -> int:
        """What the pending W passes hold: the layers' inputs and output gradients, by storage."""
        return storage_bytes(t for entries in self.pending.values() for *_, x, g in entries for t in (x, g))


def _weight_grads(inputs, grad_output, bias: bool):
    flat_grad = grad_output.reshape(-1, grad_output.shape[-1])
    weight_grad = flat_grad.t() @ inputs.reshape(-1, inputs.shape[-1])
    return weight_grad, flat_grad.sum(0) if bias else None


def _accumulate(parameter: torch.Tensor, grad: torch.Tensor) -> None:
    if parameter.grad is None:
        parameter.grad = grad.to(parameter.dtype)
    else:
        parameter.grad.add_(grad)


class _SplitLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, weight, bias, store):
        ctx.save_for_backward(inputs)
        # the parameters themselves, not saved tensors: W adds to their .grad, and a saved parameter may come
        # back as an alias (under saved-tensor hooks) whose .grad is not the parameter's
        ctx.store, ctx.weight, ctx.bias = store, weight, bias
        return F.linear(inputs, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        (inputs,), weight = ctx.saved_tensors, ctx.weight
        grad_input = grad_output @ weight
        if ctx.store.defer(weight, ctx.bias, inputs, grad_output):
            return grad_input, None, None, None
        weight_grad, bias_grad = _weight_grads(inputs, grad_output, ctx.bias is not None)
        return grad_input, weight_grad, bias_grad, None


def split_linears(model: nn.Module, store: WeightGrads) -> None:
    """Route every linear layer of ``model`` (and its head's logits) through the split backward."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = (lambda m: lambda x: _SplitLinear.apply(x, m.weight, m.bias, store))(module)
        if hasattr(module, "logits"):  # the head: F.linear with its own or the tied embedding's weight
            module.logits = lambda x, weight: _SplitLinear.apply(x, weight, None, store)
