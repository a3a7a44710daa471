"""ZeRO++ and hybrid sharding performed for real, a layer at a time (strategies/zero3.py's plan).

qwZ: each rank quantizes its parameter shard to int8 and the ranks gather the bytes; every rank dequantizes
the whole (the shards themselves, which the optimizer updates, stay exact). hpZ: after a forward gather
each rank keeps its chunk of the whole over its node's partition ("shard" group), from which backward
gathers inside the node. qgZ: each rank quantizes each rank's chunk of its gradients to int4 and sends it
there (one all-to-all: the hierarchical reduce-scatter's data on one node), and sums the dequantized
chunks it receives. hsdp: the shard group's reduce-scatter, then the shard all-reduced over the replicas
before it joins the rank's gradient shard (so gradient accumulation adds each micro-batch once).
"""

from __future__ import annotations

import torch

from simpar.real.quantize import dequantize, quantize
from simpar.collectives.schedule import chunk_sizes
from simpar.strategies.quantize import quantized_bytes


class ShardedCollectives:
    def __init__(self, comm, states, grid, rank: int, spec):
        self.comm, self.states, self.grid, self.rank, self.spec = comm, states, grid, rank, spec
        self.pending = None  # hsdp: (units, flat, shard) reduced inside the shard, awaiting the replicas
        self.dp = grid.dp

    def group(self, kind: str) -> list[int]:
        return list(self.grid.group(self.rank, kind))

    def perform(self, op) -> None:
        states, units = self.states, op.units
        if op.op == "allgather":
            numel = states.numel(units)
            if op.payload == "params (int8)":
                full = self._quantized_gather(states.shards[units].detach(), numel, self.group("dp"))
            elif op.group == "shard" and self.spec.zeropp_hpz:
                full = self.comm.ring_all_gather(states.secondary[units], numel, self.group("shard"))
            else:
                full = self.comm.ring_all_gather(states.shards[units].detach(), numel, self.group(op.group))
            states.gathered(units, full)
            if self.spec.zeropp_hpz and op.group == "dp":  # hpZ: this rank's chunk of the node's partition
                shard = self.group("shard")
                states.secondary[units] = torch.tensor_split(full, len(shard))[shard.index(self.rank)].clone()
        elif op.payload == "grads (int4)":
            flat = states.flat(units, "grad")
            states.reduced(units, flat, self._quantized_reduce(flat, self.group("dp")) / self.dp)
        elif op.op == "reducescatter":  # over dp, or (hsdp) inside the shard
            flat = states.flat(units, "grad")
            mine = self.comm.ring_reduce_scatter(flat, self.group(op.group))
            if op.group == "dp" or self.grid.replica == 1:
                states.reduced(units, flat, mine / self.dp)
            else:
                self.pending = (units, flat, mine)
        else:  # hsdp: the shard over the replicas
            units, flat, mine = self.pending
            self.pending = None
            states.reduced(units, flat, self.comm.ring_all_reduce(mine, self.group("replica")) / self.dp)

    def _quantized_gather(self, shard: torch.Tensor, numel: int, group: list[int]) -> torch.Tensor:
        lengths = chunk_sizes(numel, len(group))
        packed = quantize(shard, "int8")
        sizes = [quantized_bytes(n, "int8") for n in lengths]
        gathered = self.comm.ring_all_gather(packed, sum(sizes), group, sizes)
        return torch.cat([dequantize(piece, n, "int8", shard.dtype)
                          for piece, n in zip(torch.split(gathered, sizes), lengths)])

    def _quantized_reduce(self, flat: torch.Tensor, group: list[int]) -> torch.Tensor:
        chunks = list(torch.tensor_split(flat, len(group)))
        mine = group.index(self.rank)
        arrived = self.comm.all_to_all([quantize(c, "int4") for c in chunks], group)
        total = chunks[mine].float().clone()
        for i, packed in enumerate(arrived):
            if i != mine:
                total += dequantize(packed, chunks[mine].numel(), "int4")
        return total.to(flat.dtype)
