"""Planted bug: updates its own shard and never gathers the others' updates."""
from instructor.solutions.a4 import Zero2 as _Right
from instructor.solutions.a4 import shard_range


class Zero2(_Right):
    def step(self, flat_grads):
        self.shard.grad = self.comm.reduce_scatter(flat_grads) / self.comm.world
        self.optimizer.step()
        start, end = shard_range(self.flat.numel(), self.comm.rank, self.comm.world)
        self.flat[start:end] = self.shard.detach()
