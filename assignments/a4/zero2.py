"""A4 - ZeRO-2 for the reference executor. `pytest assignments/a4` grades it on 2 and 4 gloo ranks.

The model's parameters live in one flat fp32 buffer (`flat_params`); every rank computes gradients
on its own micro-batch into a flat buffer of the same size. You have
`comm.reduce_scatter(flat) -> this rank's chunk of the sum over ranks` and
`comm.all_gather(chunk, numel) -> every rank's chunk concatenated` (chunks as torch.tensor_split
makes them: rank i owns chunk i), plus `comm.rank` and `comm.world`.
"""

from __future__ import annotations

import torch


def shard_range(numel: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of the chunk rank owns."""
    raise NotImplementedError("A4: write shard_range")


class Zero2:
    def __init__(self, flat_params: torch.Tensor, comm, make_optimizer):
        """Keep an optimizer for this rank's shard only: `make_optimizer([tensor])` returns a
        torch.optim optimizer (the grader uses SGD and Adam) over the parameters you give it."""
        raise NotImplementedError("A4: write Zero2.__init__")

    def step(self, flat_grads: torch.Tensor) -> None:
        """One training step: gradients reduced so this rank has the mean over ranks of its shard,
        its shard updated, and `flat_params` updated everywhere - as one process training on
        every rank's micro-batch at once (the mean loss) would."""
        raise NotImplementedError("A4: write Zero2.step")

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state tensors this rank keeps."""
        raise NotImplementedError("A4: write Zero2.optimizer_state_bytes")
