"""A4 reference: ZeRO-2 for a flat parameter buffer - reduce-scatter the gradients, update only this
rank's shard (its optimizer states are all it keeps), all-gather the updated parameters."""

from __future__ import annotations

import torch


def shard_range(numel: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of rank's chunk, as torch.tensor_split splits (the first chunks one larger)."""
    base, extra = divmod(numel, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class Zero2:
    def __init__(self, flat_params: torch.Tensor, comm, make_optimizer):
        self.flat, self.comm = flat_params, comm
        start, end = shard_range(flat_params.numel(), comm.rank, comm.world)
        self.shard = torch.nn.Parameter(flat_params[start:end].detach().clone())
        self.optimizer = make_optimizer([self.shard])

    def step(self, flat_grads: torch.Tensor) -> None:
        """Gradients are this rank's; afterwards ``flat_params`` holds the updated parameters."""
        self.shard.grad = self.comm.reduce_scatter(flat_grads) / self.comm.world  # the mean over ranks
        self.optimizer.step()
        self.flat.copy_(self.comm.all_gather(self.shard.detach(), self.flat.numel()))

    def optimizer_state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for state in self.optimizer.state.values()
                   for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
