"""The Plan: what every rank does in one training step, as semantic ops on named streams.

One Plan is consumed by both the simulator (which prices it) and the reference executor (which
performs it), so ops say *what* happens ("all-gather the parameters of unit 3 across the
data-parallel group"), never how long it takes.

Ranks that do exactly the same work (every rank of plain data parallelism, every rank of one
pipeline stage) share one ``Program``: the simulator then runs that program once and performs
its collectives for all of its ranks' groups at once, which is how 1,000-GPU steps stay fast.

Streams run their ops in order; an op also waits for its ``deps`` (ops of the same program on
other streams). Streams: ``compute`` (the GPU's kernels), ``comm`` (collectives), ``send`` and
``recv`` (pipeline point-to-point; receives wait apart so they never hold up a send), ``copy``
(PCIe/NVMe copies of offload), ``host`` (the CPU's optimizer step). Alloc/Free take no time;
they mark memory per category on a rank.

Model *units*: 0 is the embedding, 1..L the transformer layers, L+1 the final norm and the
output head. Strategies split, shard and gather parameters unit by unit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

STREAMS = ("compute", "comm", "send", "recv", "copy", "host", "dp")  # dp: overlapped data-parallel collectives
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "temporaries")


# Ops are built by the hundred thousand for a large pipeline and never changed once the Plan is
# built; plain (not frozen) dataclasses with identity equality are twice as fast to create.
@dataclass(kw_only=True, eq=False)
class Op:
    id: int
    stream: str
    deps: tuple[int, ...] = ()


@dataclass(kw_only=True, eq=False)
class Compute(Op):
    """Kernels of one unit: ``phase`` fwd, bwd (recomputation included) or step (optimizer).

    ``flops`` and ``bytes`` (memory traffic) let the simulator price it as a roofline; a step on
    the host is priced by the parameters it updates."""

    phase: str
    unit: int = -1  # -1: every unit this rank holds (the optimizer step)
    part: str = ""  # a piece of the unit where tensor parallelism cuts it (costs/kernels.py); "" all of it
    microbatch: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    params: int = 0  # parameters updated, for phase "step"
    device: str = "gpu"  # gpu | host


@dataclass(kw_only=True, eq=False)
class Collective(Op):
    """A collective over the rank's ``group`` (dp, tp or pp); ``payload`` names what moves."""

    op: str  # allreduce | reducescatter | allgather | broadcast | reduce
    group: str
    nbytes: int
    algo: str | None = None
    payload: str = ""
    units: tuple[int, ...] = ()
    # ZeRO-3 by module: which of the unit's modules (ModelSpec.unit_modules order) the call moves, and,
    # when it coalesces several tensors into one call, the bytes of each (each split over the group alone)
    modules: tuple[int, ...] = ()
    pieces: tuple[int, ...] = ()
    itemsize: int = 1  # bytes per element (tensors split by elements)


@dataclass(kw_only=True, eq=False)
class _PointToPoint(Op):
    peer: str  # next | prev: the same (dp, tp) position on the neighbouring pipeline stage
    nbytes: int
    tag: str  # a Send and the Recv it feeds share a tag
    microbatch: int = 0
    units: tuple[int, ...] = ()  # the model chunk the data leaves (Send) or enters (Recv)


@dataclass(kw_only=True, eq=False)
class Send(_PointToPoint):
    """Forward: the output of ``units``' last unit; backward: the input gradient of their first."""


@dataclass(kw_only=True, eq=False)
class Recv(_PointToPoint):
    """Forward: the input of ``units``' first unit; backward: the gradient of their last unit's output."""


@dataclass(kw_only=True, eq=False)
class Copy(Op):
    """Bytes between memories of the rank's machine: gpu, host (DRAM) or nvme."""

    src: str
    dst: str
    nbytes: int
    payload: str = ""
    units: tuple[int, ...] = ()  # the model units whose shards move (empty: all the rank holds)


@dataclass(kw_only=True, eq=False)
class Alloc(Op):
    category: str
    nbytes: int
    memory: str = "gpu"  # gpu | host | nvme
    payload: str = ""
    units: tuple[int, ...] = ()  # the model units whose parameters or gradients these bytes hold
    modules: tuple[int, ...] = ()  # of those units' modules, these only (ZeRO-3 by module); () all


@dataclass(kw_only=True, eq=False)
class Free(Op):
    category: str
    nbytes: int
    memory: str = "gpu"
    payload: str = ""
    units: tuple[int, ...] = ()
    modules: tuple[int, ...] = ()


OP_CLASSES = ("forward", "backward", "optimizer step", "collectives", "pipeline p2p", "offload copies")


_COMPUTE_CLASS = {"fwd": "forward", "bwd": "backward", "step": "optimizer step"}
_CLASS_OF_KIND = {Collective: "collectives", Send: "pipeline p2p", Recv: "pipeline p2p", Copy: "offload copies"}


def op_class(op: Op) -> str | None:
    """The class an op's time is reported under (simulator and executor alike); None: takes no time."""
    kind = type(op)
    if kind is Compute:
        return _COMPUTE_CLASS[op.phase]
    return _CLASS_OF_KIND.get(kind)


def op_label(op: Op) -> str:
    """A short human name for an op (traces, plots, fault messages)."""
    if isinstance(op, Compute):
        where = "all units" if op.unit < 0 else f"unit {op.unit}"
        return f"{op.phase} {where}" + (f" mb {op.microbatch}" if op.phase != "step" else "") + \
            (f" {op.part}" if op.part else "") + (" (host)" if op.device == "host" else "")
    if isinstance(op, Collective):
        return f"{op.op} {op.payload} ({op.group}, {op.nbytes / 2**20:.2f} MiB)".replace("  ", " ")
    if isinstance(op, (Send, Recv)):
        arrow = "->" if isinstance(op, Send) else "<-"
        return f"{type(op).__name__.lower()} {op.tag} mb {op.microbatch} {arrow} {op.peer}"
    if isinstance(op, Copy):
        return f"copy {op.payload} {op.src}->{op.dst} ({op.nbytes / 2**20:.2f} MiB)".replace("  ", " ")
    if isinstance(op, (Alloc, Free)):
        return f"{type(op).__name__.lower()} {op.category} {op.payload}".strip()
    return type(op).__name__


@dataclass
class Program:
    """The ops of a set of identical ranks. ``add`` appends an op and returns its id."""

    ranks: tuple[int, ...]
    name: str = ""
    ops: list[Op] = field(default_factory=list)

    def add(self, cls, stream: str, deps=(), **fields) -> int:
        op_id = len(self.ops)
        deps = tuple(deps) if None not in deps else tuple(d for d in deps if d is not None)
        self.ops.append(cls(id=op_id, stream=stream, deps=deps, **fields))
        return op_id

    def kept_bytes(self, category: str) -> int:
        """Bytes of a model state (params, grads, optimizer) these ranks keep on the GPU (or NVMe) for the whole
        step: less than the whole model's where the state is sharded."""
        return sum(op.nbytes for op in self.ops if isinstance(op, Alloc) and op.category == category
                   and op.payload == "model states" and op.memory != "host")

    def zero_buckets(self) -> list[tuple[int, ...]]:
        """The units of each data-parallel reduce-scatter, in order, once each: the buckets these ranks keep a
        shard of and step one tensor for (ZeRO-3: a unit each; ZeRO-1 and 2: one for all); [] elsewhere."""
        return list(dict.fromkeys(op.units for op in self.ops
                                  if isinstance(op, Collective) and op.op == "reducescatter" and op.group != "tp"))

    def reduces_grads(self) -> bool:
        """Whether these ranks make a data-parallel call of their gradients (whose handling, in the executor,
        touches every gradient before the optimizer step): not tp's or pp's alone."""
        return any(isinstance(op, Collective) and op.payload == "grads" for op in self.ops)

    def calls_after_step(self) -> set[int]:
        """Ids of the collectives whose stretch since the previous call, send or receive holds the optimizer
        step, round the step: a step's first call follows the previous step's optimizer."""
        stepped, across = set(), False
        for op in self.ops + self.ops:
            if isinstance(op, (Collective, Send, Recv)):
                if across and isinstance(op, Collective):
                    stepped.add(op.id)
                across = False
            elif isinstance(op, Compute) and op.phase == "step":
                across = True
        return stepped

    def alloc(self, stream: str, category: str, nbytes: float, memory: str = "gpu", payload: str = "",
              deps=(), units: tuple[int, ...] = (), modules: tuple[int, ...] = ()) -> int:
        return self.add(Alloc, stream, deps, category=category, nbytes=int(nbytes), memory=memory, payload=payload,
                        units=units, modules=modules)

    def free(self, stream: str, category: str, nbytes: float, memory: str = "gpu", payload: str = "",
             deps=(), units: tuple[int, ...] = (), modules: tuple[int, ...] = ()) -> int:
        return self.add(Free, stream, deps, category=category, nbytes=int(nbytes), memory=memory, payload=payload,
                        units=units, modules=modules)

    def stream(self, name: str) -> Iterator[Op]:
        return (op for op in self.ops if op.stream == name)


@dataclass(frozen=True)
class Grid:
    """Ranks laid out as pp x dp x tp, tensor-parallel fastest (so a TP group shares a node, as
    Megatron places it), then data-parallel, then pipeline stage. The dp ranks may be carved into
    contiguous blocks of ``shard`` (hybrid sharding, ZeRO++'s hpZ: groups "shard", and "replica" across them);
    a stage's dp x tp ranks into contiguous blocks of ``ep`` (expert parallelism: groups "ep", and "edp"
    across the blocks: MoE layers' experts are whole on a rank, so Megatron carves them from dp x tp). With
    context parallelism ``dp`` counts every rank holding the stage's weights (data x context parallel), and
    contiguous blocks of ``cp`` of them share each sequence (group "cp", between TP and DP as in Megatron)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    ep: int = 1
    shard: int = 1
    cp: int = 1  # context parallelism: contiguous blocks of cp dp indices split each sequence (group "cp")

    @property
    def edp(self) -> int:
        return self.dp * self.tp // self.ep

    @property
    def replica(self) -> int:
        return self.dp // self.shard

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp stage, dp index, tp index) of a rank."""
        stage, rest = divmod(rank, self.dp * self.tp)
        return stage, rest // self.tp, rest % self.tp

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """The ranks of a pipeline stage: a contiguous block (the stage is the slowest coordinate)."""
        size = self.dp * self.tp
        return tuple(range(stage * size, (stage + 1) * size))

    def rank(self, stage: int, dp_index: int, tp_index: int) -> int:
        return stage * self.dp * self.tp + dp_index * self.tp + tp_index

    def group(self, rank: int, kind: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s dp, tp or pp group, in group order."""
        stage, d, t = self.coords(rank)
        if kind == "dp":
            return tuple(self.rank(stage, i, t) for i in range(self.dp))
        if kind == "tp":
            return tuple(self.rank(stage, d, i) for i in range(self.tp))
        if kind == "pp":
            return tuple(self.rank(s, d, t) for s in range(self.pp))
        if kind in ("ep", "edp"):  # over the stage's dp x tp ranks (experts are not split by tp)
            base, flat, size = self.rank(stage, 0, 0), d * self.tp + t, self.ep
            if kind == "ep":
                return tuple(range(base + flat - flat % size, base + flat - flat % size + size))
            return tuple(range(base + flat % size, base + self.dp * self.tp, size))
        if kind == "stage":  # every rank of the stage: its data-, context- and tensor-parallel ranks
            return self.stage_ranks(stage)
        if kind == "cp":
            first = d - d % self.cp
            return tuple(self.rank(stage, i, t) for i in range(first, first + self.cp))
        if kind in ("shard", "replica"):
            first = d - d % self.shard
            if kind == "shard":  # the contiguous block of dp indices holding d
                return tuple(self.rank(stage, i, t) for i in range(first, first + self.shard))
            return tuple(self.rank(stage, i, t) for i in range(d % self.shard, self.dp, self.shard))
        raise ValueError(f"unknown group kind {kind!r}")

    def peer(self, rank: int, direction: str) -> int:
        """The same (dp, tp) position on the next or previous stage (wrapping, for interleaving)."""
        stage, d, t = self.coords(rank)
        step = 1 if direction == "next" else -1
        return self.rank((stage + step) % self.pp, d, t)


@dataclass
class Plan:
    strategy: str
    grid: Grid
    programs: list[Program]
    notes: list[str] = field(default_factory=list)  # modelling choices worth telling the user

    def program_of(self, rank: int) -> Program:
        for program in self.programs:
            if rank in program.ranks:
                return program
        raise ValueError(f"rank {rank} is in no program")

    def groups(self, program: Program, kind: str) -> list[tuple[int, ...]]:
        """The distinct groups of ``kind`` that the program's ranks belong to (a rank already placed
        in a group found earlier is skipped: building every rank's group is quadratic at 1,000 ranks)."""
        found, placed = set(), set()
        for r in program.ranks:
            if r not in placed:
                group = self.grid.group(r, kind)
                found.add(group)
                placed.update(group)
        return sorted(found)
