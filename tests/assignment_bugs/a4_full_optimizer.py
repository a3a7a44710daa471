"""Planted bug: every rank keeps the optimizer for the whole model (all-reduce + full step):
trains right, but it is DDP's memory, not ZeRO-2's."""
import torch

from instructor.solutions.a4 import shard_range  # noqa: F401


class Zero2:
    def __init__(self, flat_params, comm, make_optimizer):
        self.flat, self.comm = flat_params, comm
        self.full = torch.nn.Parameter(flat_params.detach().clone())
        self.optimizer = make_optimizer([self.full])

    def step(self, flat_grads):
        mine = self.comm.reduce_scatter(flat_grads.clone())
        self.full.grad = self.comm.all_gather(mine, flat_grads.numel()) / self.comm.world
        self.optimizer.step()
        self.flat.copy_(self.full.detach())

    def optimizer_state_bytes(self):
        return sum(t.numel() * t.element_size() for s in self.optimizer.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0)
