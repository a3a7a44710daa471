"""Planted bug: the reduced gradient is the sum over ranks, not the mean."""
import torch  # noqa: F401

from instructor.solutions.a4 import Zero2 as _Right
from instructor.solutions.a4 import shard_range  # noqa: F401


class Zero2(_Right):
    def step(self, flat_grads):
        self.shard.grad = self.comm.reduce_scatter(flat_grads)
        self.optimizer.step()
        self.flat.copy_(self.comm.all_gather(self.shard.detach(), self.flat.numel()))
