"""Collectives performed with explicit point-to-point sends, so the bytes a rank sends are the
algorithm's bytes, counted where they are sent.

Ring chunk ownership and Worker-Server roles are the ones ``simpar.collectives`` prices, so a
simulated and a measured run can be compared byte for byte: after a reduce-scatter rank i holds
the reduced chunk i of ``torch.tensor_split(flat, n)``; in reduce-scatter step k rank i sends
chunk (i-k-1) mod n to rank i+1; in all-gather step k it sends chunk (i-k) mod n.
Worker-Server uses the group's first rank as the server (no dedicated server process).

Sends in a ring step are posted non-blocking before the matching receive, so no step can
deadlock whatever the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist



def message_tag(tag: str) -> int:
    """The Plan's tag of a pipeline message ("F mb3 vs2") as the backend's integer tag: ZB-V's stages send a
    pair of them forward and backward messages in orders their receives do not keep."""
    kind, mb, vs = tag.split()
    return 1 + (int(mb[2:]) * 1024 + int(vs[2:])) * 2 + (kind == "B")


class CountingComm:
    """Point-to-point traffic of one rank, with the byte counters the executor reports."""

    def __init__(self, rank: int):
        self.rank = rank
        self.sent = 0
        self.received = 0

    def _exchange(self, send: torch.Tensor | None, dst: int, recv: torch.Tensor | None, src: int,
                  tag: int = 0) -> None:
        request = None
        if send is not None and send.numel():
            send = send.contiguous()
            request = dist.isend(send, dst)
            nbytes = send.numel() * send.element_size()
            self.sent += nbytes
        if recv is not None and recv.numel():
            dist.recv(recv, src, tag=tag)
            self.received += recv.numel() * recv.element_size()
        if request is not None:
            request.wait()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        """A non-blocking send (pipeline stages): the caller waits on the returned request. ``tag`` matches it
        to its receive where a pair of stages exchanges messages in different orders (ZB-V)."""
        nbytes = tensor.numel() * tensor.element_size()
        self.sent += nbytes
        return dist.isend(tensor, dst, tag=tag)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._exchange(tensor, dst, None, -1)

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self._exchange(None, -1, tensor, src, tag)

    # -- ring ---------------------------------------------------------------------------------
    def ring_reduce_scatter(self, flat: torch.Tensor, group: list[int], op: str = "sum") -> torch.Tensor:
        """Reduce ``flat`` over the group (``op`` sum or max); returns this rank's reduced chunk (a
        copy). ``flat`` is used as scratch: its other chunks hold partial results afterwards."""
        return self.ring_reduce_scatter_coalesced([flat], group, op)

    def ring_reduce_scatter_coalesced(self, pieces: list[torch.Tensor], group: list[int],
                                      op: str = "sum") -> torch.Tensor:
        """Reduce several tensors over the group in one ring (a coalesced call, as DeepSpeed's ZeRO-3 reduces
        a layer's modules): each of the n - 1 steps sends every piece's chunk in one message, so the call
        pays n - 1 exchanges, not n - 1 per piece. Returns this rank's chunk of each piece, concatenated
        (the same sums, in the same order, as reducing the pieces one by one); the pieces are scratch."""
        n, i = len(group), group.index(self.rank)
        chunks = [list(torch.tensor_split(piece, n)) for piece in pieces]
        right, left = group[(i + 1) % n], group[(i - 1) % n]
        for k in range(n - 1):
            out, into = (i - k - 1) % n, (i - k - 2) % n
            sizes = [c[into].numel() for c in chunks]
            incoming = torch.empty(sum(sizes), dtype=pieces[0].dtype, device=pieces[0].device)
            message = chunks[0][out] if len(chunks) == 1 else torch.cat([c[out] for c in chunks])
            self._exchange(message, right, incoming, left)
            for c, part in zip(chunks, torch.split(incoming, sizes)):
                if op == "max":
                    torch.maximum(c[into], part, out=c[into])
                else:
                    c[into] += part
        return torch.cat([c[i] for c in chunks])  # (a copy, even of one piece)

    def ring_all_gather(self, mine: torch.Tensor, numel: int, group: list[int],
                        sizes: list[int] | None = None) -> torch.Tensor:
        """Gather every rank's chunk (``mine`` is chunk i of a ``numel``-element tensor: its tensor_split
        chunk, or of ``sizes`` elements each where given)."""
        n, i = len(group), group.index(self.rank)
        out = torch.empty(numel, dtype=mine.dtype, device=mine.device)
        chunks = list(torch.split(out, sizes) if sizes else torch.tensor_split(out, n))
        chunks[i].copy_(mine)
        right, left = group[(i + 1) % n], group[(i - 1) % n]
        for k in range(n - 1):
            self._exchange(chunks[(i - k) % n], right, chunks[(i - k - 1) % n], left)
        return out

    def ring_all_reduce(self, flat: torch.Tensor, group: list[int], op: str = "sum") -> torch.Tensor:
        mine = self.ring_reduce_scatter(flat, group, op)
        return self.ring_all_gather(mine, flat.numel(), group)

    def all_reduce_grads(self, params: list, group: list[int], scale: float = 1.0) -> None:
        """Sum ``params``' gradients over the group in one ring all-reduce of their concatenation, each
        gradient then holding its sum times ``scale``."""
        if not params:
            return
        total = self.ring_all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), group)
        for p, piece in zip(params, torch.split(total, [p.numel() for p in params])):
            p.grad.copy_(piece.view_as(p.grad) * scale)

    # -- all-to-all ----------------------------------------------------------------------------
    def all_to_all(self, chunks: list[torch.Tensor], group: list[int]) -> list[torch.Tensor]:
        """Pairwise exchange (collectives/alltoall.py): in step k rank i sends ``chunks[i + k]`` to rank
        i + k and receives from rank i - k a tensor shaped like its own chunk for it. Returns what each
        rank of the group sent this one (its own chunk copied)."""
        n, i = len(group), group.index(self.rank)
        received = [None] * n
        received[i] = chunks[i].clone()
        for k in range(1, n):
            to, source = (i + k) % n, (i - k) % n
            received[source] = torch.empty_like(chunks[source])
            self._exchange(chunks[to], group[to], received[source], group[source])
        return received

    # -- Worker-Server ------------------------------------------------------------------------
    def ps_all_reduce(self, flat: torch.Tensor, group: list[int]) -> torch.Tensor:
        """Workers push to the server (the group's first rank), which sums and sends the sum back."""
        server = group[0]
        if self.rank != server:
            self.send(flat, server)
            result = torch.empty_like(flat)
            self.recv(result, server)
            return result
        total = flat.clone()
        incoming = torch.empty_like(flat)
        for worker in group[1:]:  # summed in rank order: the same result on every run
            self.recv(incoming, worker)
            total += incoming
        for worker in group[1:]:
            self.send(total, worker)
        return total


class NativeComm(CountingComm):
    """The backend's own collectives (``--collectives native``), for timing what a framework would
    call. Their traffic is the backend's business (gloo, for one, performs a reduce-scatter as an
    all-reduce), so it is not counted: ``sent`` and ``received`` stay None and reports say so.
    Uneven chunks are padded for the all-gather, as the collectives need equal sizes."""

    def __init__(self, rank: int, groups: list[tuple[int, ...]]):
        super().__init__(rank)
        self.sent = self.received = None
        # every rank creates every group, in the same order, as torch.distributed requires
        self._groups = {g: dist.new_group(list(g)) for g in groups}

    def _exchange(self, send, dst, recv, src, tag: int = 0) -> None:
        if send is not None and send.numel():
            dist.send(send.contiguous(), dst)
        if recv is not None and recv.numel():
            dist.recv(recv, src, tag=tag)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        return dist.isend(tensor, dst, tag=tag)

    def ring_all_reduce(self, flat: torch.Tensor, group: list[int], op: str = "sum") -> torch.Tensor:
        if len(group) > 1:
            reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM
            dist.all_reduce(flat, op=reduce_op, group=self._groups[tuple(group)])
        return flat

    def ring_reduce_scatter(self, flat: torch.Tensor, group: list[int], op: str = "sum") -> torch.Tensor:
        reduced = self.ring_all_reduce(flat, group, op)
        return torch.tensor_split(reduced, len(group))[group.index(self.rank)].clone()

    def ring_reduce_scatter_coalesced(self, pieces: list[torch.Tensor], group: list[int]) -> torch.Tensor:
        return torch.cat([self.ring_reduce_scatter(piece, group) for piece in pieces])

    def ring_all_gather(self, mine: torch.Tensor, numel: int, group: list[int]) -> torch.Tensor:
        n = len(group)
        sizes = [c.numel() for c in torch.tensor_split(torch.empty(numel, device="meta"), n)]
        padded = torch.zeros(max(sizes), dtype=mine.dtype, device=mine.device)
        padded[:mine.numel()] = mine
        gathered = torch.empty(n * max(sizes), dtype=mine.dtype, device=mine.device)
        if n > 1:
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
            gather(gathered, padded, group=self._groups[tuple(group)])
        else:
            gathered.copy_(padded)
        return torch.cat([gathered[i * max(sizes):i * max(sizes) + size] for i, size in enumerate(sizes)])

    def ps_all_reduce(self, flat: torch.Tensor, group: list[int]) -> torch.Tensor:
        return self.ring_all_reduce(flat, group)
