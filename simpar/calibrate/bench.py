"""Micro-benchmarks of the machine at hand, run as ``launch`` workers (every rank runs the same
benchmark at the same time, so running k ranks measures what k ranks sharing the machine get).

Nothing here runs a distributed strategy: compute is timed unit by unit (embedding, layer, head,
forward and backward) by the executor's own step on one rank (compute_bench.py), communication
with the executor's own ring code (back to back, and in the pattern a step uses: a unit's compute,
then the collectives), the optimizer step and memory copies on bare tensors. ``simpar validate`` then
judges the fitted profile on whole strategies the fit never saw.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from simpar.calibrate.fits import SERIES
from simpar.models import model
from simpar.real.comm import CountingComm
from simpar.real.model import build_model
from simpar.real.states import make_optimizer


def _timed(fn, repeats: int) -> float:
    """Seconds per ``fn()`` with every rank running it ``repeats`` times back to back, from a barrier
    until all are done: k ranks sharing the cores are timed as a step would be, by how long all of
    them take. The closing barrier's own cost (measured alone) is taken off; the median of 5 rounds."""
    return _together(fn, repeats)[0]


def _together(fn, repeats: int) -> tuple[float, float]:
    """(``_timed``'s seconds per ``fn()``: until the slowest rank is done; this rank's own seconds per ``fn()``
    in the same rounds, without the wait for the slowest), each the median of 5 rounds."""
    fn()

    def between_barriers(work) -> tuple[float, float]:
        dist.barrier()
        start = time.perf_counter()
        work()
        mine = time.perf_counter() - start
        dist.barrier()
        return time.perf_counter() - start, mine

    barrier = statistics.median(between_barriers(lambda: None)[0] for _ in range(5))
    rounds = [between_barriers(lambda: [fn() for _ in range(repeats)]) for _ in range(5)]
    slowest = max(statistics.median(all_done for all_done, _ in rounds) - barrier, 0.0) / repeats
    return slowest, statistics.median(mine for _, mine in rounds) / repeats


def ring_worker(ctx, sizes: list[int], repeats: int) -> list[dict]:
    """A ring all-gather of each size over every rank, with the executor's own code (k - 1 ring
    steps of size/k bytes each, the chunks copied into place), every rank at once; each timed alone
    (the mean of 5 x ``repeats``: a step pays the occasional stalled call too, and a median would
    hide it); the steps keep the ranks in step, a barrier would cost more."""
    comm = CountingComm(ctx.rank)
    group = list(range(ctx.world))
    rows = []
    for size in [sizes[0]] + list(sizes):  # the first size twice: its first pass warms the connections up
        numel = max(size // 4, ctx.world)
        mine = torch.tensor_split(torch.zeros(numel), ctx.world)[ctx.rank]
        samples = []
        dist.barrier()
        for _ in range(5 * repeats + 2):
            start = time.perf_counter()
            comm.ring_all_gather(mine, numel, group)
            samples.append(time.perf_counter() - start)
        rows.append({"bytes": numel * 4, "seconds": statistics.fmean(samples[2:])})
    return rows[1:]


def host_worker(ctx, params: list[int], repeats: int) -> dict:
    """Optimizer steps (Adam, SGD) and memory copies on bare tensors (the host's optimizer, offload's copies)."""
    steps, copies = [], []
    for n in params:
        weight = torch.nn.Parameter(torch.randn(n))
        weight.grad = torch.randn(n)
        for name in ("adam", "sgd"):
            optimizer = make_optimizer(name, [weight])
            steps.append({"optimizer": name, "params": n, "seconds": _timed(optimizer.step, repeats)})
        target = torch.empty(n)
        copies.append({"bytes": 4 * n, "seconds": _timed(lambda: target.copy_(weight.detach()), repeats)})
    return {"steps": steps, "copies": copies}


# handoff: a pipeline stage's send on, receive from behind; psreduce: the executor's Worker-Server all-reduce
PATTERN_OPS = ("allgather", "allreduce", "handoff", "psreduce")


def pattern_worker(ctx, sizes: list[int], repeats: int, rounds: int = 5) -> dict:
    """Collectives as a step meets them: one unit's compute (``_unit_burst``), then ``m`` of the
    executor's ring all-gathers or all-reduces in a row (m = 1 and ``SERIES``), every rank at
    once, repeated. Each loop is timed between two barriers, right after the same loop without the
    collectives (this machine's speed drifts by tens of percent over a minute, so each round is
    measured against its own neighbour, not against a base taken minutes before): the difference per
    repetition is everything the step pays for its m calls, the wait for a peer still computing and
    the wake-up of a blocked receive included. {"base": [s per compute alone, every round],
    "<op><bytes>x<m>": [s of m calls beyond the compute, per round], "compute": [s of each compute
    burst that followed a call], "compute_base": [s of each burst of the loops without calls], "series":
    [[compute end, end of each call] per repetition of the collectives' series, clock times]}: the
    timestamps, taken by every rank on the machine's one monotonic clock, give ``series_wake``; the
    difference of compute and compute_base is what a unit computed right after a call pays more (resume), both
    with every rank computing at once and taken minutes apart at most, round by round. "issued": [s the isend of each handoff right after
    the compute held its rank] (``_handoff``)."""
    comm, group, n = CountingComm(ctx.rank), list(range(ctx.world)), ctx.world
    unit = _unit_burst()
    reps = max(4, 4 * repeats // n)  # more ranks than cores make every call slower: fewer of them

    bursts: dict[bool, list[float]] = {True: [], False: []}  # after calls?
    # per repetition of a ring collective's series (and apart, a Worker-Server one's): [compute end, each call's end]
    series: dict[bool, list[list[float]]] = {False: [], True: []}  # Worker-Server?
    issued: list[float] = []  # seconds the isend of each handoff right after computing held its rank

    def loop(collective, calls: int, marks: list | None = None) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            began = time.perf_counter()
            unit()
            ends = [time.perf_counter()]
            bursts[bool(calls)].append(ends[0] - began)
            for call in range(calls):
                held = collective()
                if call == 0 and isinstance(held, float):  # a handoff's isend
                    issued.append(held)
                ends.append(time.perf_counter())
            if marks is not None:
                marks.append(ends)
        dist.barrier()
        return (time.perf_counter() - start) / reps

    out = {"base": [], "compute": bursts[True], "compute_base": bursts[False], "series": series[False],
           "series_ps": series[True], "issued": issued}

    def beyond_compute(collective, calls: int, marks: list | None) -> float:
        out["base"].append(loop(lambda: None, 0))
        return loop(collective, calls, marks) - out["base"][-1]

    def caller(op: str, size: int):
        numel = max(size // 4, n)
        flat = torch.zeros(numel)
        mine = torch.tensor_split(flat, n)[ctx.rank]
        return {"allgather": lambda: comm.ring_all_gather(mine, numel, group),
                "allreduce": lambda: comm.ring_all_reduce(flat, group),
                "handoff": lambda: _handoff(comm, flat, ctx.rank, n),
                "psreduce": lambda: comm.ps_all_reduce(flat, group)}[op]

    loop(lambda: None, 0)  # warm-up
    bursts[False].clear()
    calls_of = {(op, size): caller(op, size) for op in PATTERN_OPS for size in sizes}
    # every op and size once a round, the rounds one after another: each row's rounds spread over the whole
    # pattern, not a second or two of it, as the cores' states last 0.25-6.5 s (a 2 MiB Worker-Server call
    # after a unit took 1.3 ms in one state and 2.5 ms in the other, minutes apart)
    for _ in range(rounds):
        for (op, size), call in calls_of.items():
            for calls in (1, SERIES):
                marks = series[op == "psreduce"] if calls > 1 and op != "handoff" else None
                out.setdefault(f"{op}{size}x{calls}", []).append(beyond_compute(call, calls, marks))
    return out


# units computed before a call in phase_worker's loops: one (what the wake is measured after) to a whole
# data-parallel step (tiny-deep's 2-rank DDP step computes about 24 units' worth before its last call)
PHASE_UNITS = (1, 4, 8, 16, 32)
SHORT_PHASE = 3e-4  # seconds (alone) of a tensor-parallel piece's compute (short_calls.py's products)
# phase_worker's short compute: the unit's forward once (0.35-0.45 ms alone: a tensor-parallel piece's), and twice,
# as tp's calls rose 1.1-1.7 ms a ms from 0.4 to 0.7 ms of it; the kind of work tp's pieces are, their resume
# included, where small matrix products pay none (docs/calibration.md, "The short loops compute what tp computes")
# ... and "brief", the forward at micro-batch 1, near a forward piece's length: the cost rises faster than a
# line over the first few tenths of a millisecond. {loop: (forwards, micro-batch)}
SHORT_LOOPS = {"brief": (1, 1), "short": (1, 2), "mid": (2, 2)}
# repetitions of the short loop a round, and how many of its first are not kept: right after the long loops
# and a barrier a call is slow for about five repetitions (2 ranks, 256 KiB: 2.2-2.4 ms, then 1.0-1.1 by the
# sixth; caches cold after the time away from the calls, as the once-a-step units' are), where tp's calls
# come one after another
SHORT_REPS, SHORT_WARMUP = 60, 20


def phase_worker(ctx, size: int, seconds: float = 8.0, repeats: int = 3, short_size: int | None = None) -> dict:
    """How a call's cost grows with the compute before it: ``pattern_worker``'s unit computed each of
    ``PHASE_UNITS`` times in a row, then one all-reduce of ``size`` bytes (the executor's ring), every
    rank at once; the loops interleaved round by round against the machine's drift, rounds repeated
    until ``seconds`` have passed. {"short": [...], "mid": [...], "1": [...], ...}: per repetition [compute
    start, compute end, call end] on the machine's one monotonic clock (``phase_cost``). The growth
    flattens: at 2 ranks the call cost 2.5 / 3.4 / 3.6 / 4.5 / 4.7 ms after 1.2 / 4.4 / 8.3 / 16 / 24 ms of
    compute (a line through the first and third points priced the last 6.0 ms), as the ranks' lag behind
    each other grows like a random walk's (0.5 / 1.2 / 1.3 / 1.7 / 2.0 ms), hence several lengths, spanning
    a step's. With more ranks than
    cores the scheduler hands the cores out in time slices, unevenly, so the ranks leave a long phase
    further apart and the call waits for the slowest: at 4 ranks on 2 cores a DDP step's ranks reached
    its all-reduce 4-17 ms apart. At 2 ranks they drift apart while their cores run at different speeds:
    each vCPU of the development VM flips between a fast and a slow state for 0.25-6.5 s at a time
    ; seconds of rounds average the states.
    "brief", "short" and "mid" (``SHORT_LOOPS``): the unit's forward once at micro-batch 1, once and twice at
    ``BURST_UNIT``'s, then one all-reduce of ``short_size`` bytes (``size`` if None), as tensor parallelism's
    pieces and calls follow each other ([start, compute end, call end]), ``SHORT_REPS`` a round, the first
    ``SHORT_WARMUP`` not kept (cold after the long loops). A call after a short compute costs less than after a
    unit: at 2 ranks a 4 KiB all-reduce cost 0.9 ms back to back, 0.8 after 0.1 ms of compute
    (products), 1.7 after 0.3, 2.4 after 0.6, 2.8 after 1.1 and 3.2 after the unit (2.1 ms), mean of 150."""
    comm, group = CountingComm(ctx.rank), list(range(ctx.world))
    unit = _unit_burst()
    flat = torch.zeros(max(size // 4, ctx.world))
    short_flat = torch.zeros(max((short_size or size) // 4, ctx.world))
    calls = {**{key: lambda: comm.ring_all_reduce(short_flat, group) for key in SHORT_LOOPS},
             **{str(units): lambda: comm.ring_all_reduce(flat, group) for units in PHASE_UNITS}}
    marks: dict[str, list[list[float]]] = {key: [] for key in calls}
    forwards = {batch: _unit_burst(backward=False, batch=batch) for _, batch in SHORT_LOOPS.values()}
    shorts = {key: (lambda times=times, f=forwards[batch]: [f() for _ in range(times)])
              for key, (times, batch) in SHORT_LOOPS.items()}
    for _ in range(3):  # warm up: a fresh process's first backward takes tens of milliseconds
        unit()
    comm.ring_all_reduce(flat, group)  # and the connections
    comm.ring_all_reduce(short_flat, group)
    began, more = time.perf_counter(), torch.ones(1)
    while more.item():
        for key, call in calls.items():
            dist.barrier()
            short = shorts.get(key)
            for rep in range(SHORT_REPS if short else repeats):
                start = time.perf_counter()
                if short:
                    short()
                for _ in range(0 if short else int(key)):
                    unit()
                ends = [start, time.perf_counter()]
                call()
                ends.append(time.perf_counter())
                if not short or rep >= SHORT_WARMUP:
                    marks[key].append(ends)
        more.fill_(float(time.perf_counter() - began < seconds))
        dist.broadcast(more, 0)  # rank 0's clock decides for all, so every rank runs the same rounds
    return marks


def phase_cost(marks_by_rank: list[list[list[float]]]) -> tuple[float, float]:
    """(seconds of compute, seconds of the call after it) from ``phase_worker``'s marks of one loop kind
    (every rank's list, repetition by repetition): each the mean over ranks, as the simulator's one
    compute end and one call stand for all of theirs, then over repetitions."""
    phases, calls = [], []
    for marks in zip(*marks_by_rank):
        phases.append(statistics.fmean(m[1] - m[0] for m in marks))
        calls.append(statistics.fmean(m[2] - m[1] for m in marks))
    return statistics.fmean(phases), statistics.fmean(calls)


def _handoff(comm: CountingComm, tensor: torch.Tensor, rank: int, world: int) -> float:
    """What a pipeline stage does between two computes: ``isend`` on to the next rank (the executor's
    own call, waited on later), a blocking receive from the one behind. Returns how long the ``isend``
    call itself held the rank: it wakes threads (gloo's, the peer's) that may take the rank's core, for
    up to a scheduler tick (2 ranks: 0.18 ms median, 0.77 ms mean, p90 4.5 ms; 0.89 and 1.76 ms mean at 4
    and 8 ranks, 4 KiB), time the sender spends in no compute and no wait."""
    began = time.perf_counter()
    request = comm.isend(tensor, (rank + 1) % world)
    held = time.perf_counter() - began
    comm.recv(torch.empty_like(tensor), (rank - 1) % world)
    request.wait()
    return held


BURST_UNIT = ("tiny-deep", 2)  # _unit_burst's model and micro-batch: its layer is a row of compute_worker's


def _unit_burst(backward: bool = True, batch: int | None = None):
    """The compute of ``pattern_worker``: a tiny-deep layer's forward and backward at micro-batch 2
    (what a step computes per unit; a short no-grad forward alone reads a larger slowdown, 1.7x
    against 1.3x at 2 ranks, as part of the slowdown is a fixed cost of resuming after a call). Without
    ``backward``: its forward alone (autograd recording, as the executor's), a third of it. ``batch``: another
    micro-batch than ``BURST_UNIT``'s."""
    name, batch = BURST_UNIT[0], batch or BURST_UNIT[1]
    spec = model(name)
    layer = build_model(spec).units[1]
    hidden = torch.randn(batch, spec.seq, spec.hidden)

    def unit():
        x = hidden.detach().requires_grad_()
        out = layer(x)
        if backward:
            out.backward(torch.ones_like(out))
    return unit
