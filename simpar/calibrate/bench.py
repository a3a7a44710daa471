"""Micro-benchmarks of collectives and the host, run as ``launch`` workers: every rank runs the same benchmark
at once, so k ranks measure what k ranks sharing the machine get. Communication uses the executor's own ring
code, back to back and in the pattern a step meets it (a unit's compute, then calls). No strategy runs here;
``simpar validate`` judges the fitted profile on whole strategies the fit never saw."""

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
    """Seconds per ``fn()`` with every rank running it ``repeats`` times back to back, from a barrier until all
    are done (as a step is timed), the closing barrier's own cost taken off; the median of 5 rounds."""
    fn()

    def between_barriers(work) -> float:
        dist.barrier()
        start = time.perf_counter()
        work()
        dist.barrier()
        return time.perf_counter() - start

    barrier = statistics.median(between_barriers(lambda: None) for _ in range(5))
    rounds = [between_barriers(lambda: [fn() for _ in range(repeats)]) for _ in range(5)]
    return max(statistics.median(rounds) - barrier, 0.0) / repeats


def ring_worker(ctx, sizes: list[int], repeats: int) -> list[dict]:
    """A ring all-gather of each size, back to back, every rank at once: the mean of 5 x ``repeats`` calls (a
    step pays the occasional stalled call too, which a median would hide)."""
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


def pattern_worker(ctx, sizes: list[int], repeats: int, rounds: int = 5,
                   counts: tuple[int, ...] = (1, SERIES), least: int = 4) -> dict:
    """Collectives as a step meets them: one unit's compute (``_unit_burst``), then ``m`` calls in a row (m in
    ``counts``: 1 and ``SERIES``) of each of ``PATTERN_OPS``, every rank at once, at least ``least`` times a
    loop. Each loop is timed between barriers right after the same loop without calls (each round against its
    neighbour, as the machine's speed drifts): the difference is all the step pays for its calls, waits included.
    {"<op><bytes>x<m>": [s beyond the compute, per round], "base": [s of the compute alone], "compute" /
    "compute_base": [s of each burst after a call / in the loops without], "series" / "series_ps": [[compute
    end, each call's end] per repetition of a ring / Worker-Server series, on the one monotonic clock]}."""
    comm, group, n = CountingComm(ctx.rank), list(range(ctx.world)), ctx.world
    unit = _unit_burst()
    reps = max(least, 4 * repeats // n)  # more ranks than cores make every call slower: fewer of them

    bursts: dict[bool, list[float]] = {True: [], False: []}  # after calls?
    series: dict[bool, list[list[float]]] = {False: [], True: []}  # Worker-Server?

    def loop(collective, calls: int, marks: list | None = None) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            began = time.perf_counter()
            unit()
            ends = [time.perf_counter()]
            bursts[bool(calls)].append(ends[0] - began)
            for _ in range(calls):
                collective()
                ends.append(time.perf_counter())
            if marks is not None:
                marks.append(ends)
        dist.barrier()
        return (time.perf_counter() - start) / reps

    out = {"base": [], "compute": bursts[True], "compute_base": bursts[False], "series": series[False],
           "series_ps": series[True]}

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
    # every op and size once a round: each row's rounds spread over the whole pattern, not a second of it
    for _ in range(rounds):
        for (op, size), call in calls_of.items():
            for calls in counts:
                marks = series[op == "psreduce"] if calls > 1 and op != "handoff" else None
                out.setdefault(f"{op}{size}x{calls}", []).append(beyond_compute(call, calls, marks))
    return out


# units computed before a call in phase_worker's loops: one (what the wake is measured after) to a whole
# data-parallel step (tiny-deep's 2-rank DDP step computes about 24 units' worth before its last call)
PHASE_UNITS = (1, 4, 8, 16, 32)
# phase_worker's short computes, as long as tensor-parallel pieces: {loop: (forwards of the unit, micro-batch)}
SHORT_LOOPS = {"brief": (1, 1), "short": (1, 2), "mid": (2, 2)}
# repetitions of a short loop a round, and how many of its first are not kept (cold after the long loops)
SHORT_REPS, SHORT_WARMUP = 60, 20


def phase_worker(ctx, size: int, seconds: float = 8.0, repeats: int = 3, short_size: int | None = None,
                 units: tuple[int, ...] = PHASE_UNITS, short_loops: bool = True) -> dict:
    """How a call's cost grows with the compute before it (the ranks' lag behind each other grows with it):
    the unit computed ``units`` times in a row, then one ring all-reduce of ``size`` bytes; and with
    ``short_loops`` the short loops (``SHORT_LOOPS``: tensor-parallel pieces' computes), then one of
    ``short_size``. Every rank at once, the loops interleaved round by round until ``seconds`` have passed.
    {loop: [[compute start, compute end, call end] per repetition]} on the one monotonic clock (``phase_cost``)."""
    comm, group = CountingComm(ctx.rank), list(range(ctx.world))
    unit = _unit_burst()
    flat = torch.zeros(max(size // 4, ctx.world))
    short_flat = torch.zeros(max((short_size or size) // 4, ctx.world))
    calls = {**{key: lambda: comm.ring_all_reduce(short_flat, group) for key in SHORT_LOOPS if short_loops},
             **{str(count): lambda: comm.ring_all_reduce(flat, group) for count in units}}
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
    """(seconds of compute, seconds of the call after it) from ``phase_worker``'s marks of one loop (every rank's
    list): each the mean over ranks, then over repetitions."""
    phases, calls = [], []
    for marks in zip(*marks_by_rank):
        phases.append(statistics.fmean(m[1] - m[0] for m in marks))
        calls.append(statistics.fmean(m[2] - m[1] for m in marks))
    return statistics.fmean(phases), statistics.fmean(calls)


def _handoff(comm: CountingComm, tensor: torch.Tensor, rank: int, world: int) -> None:
    """What a pipeline stage does between two computes: ``isend`` on to the next rank, a blocking receive
    from the one behind (the executor's own calls)."""
    request = comm.isend(tensor, (rank + 1) % world)
    comm.recv(torch.empty_like(tensor), (rank - 1) % world)
    request.wait()


BURST_UNIT = ("tiny-deep", 2)  # _unit_burst's model and micro-batch: its layer is a row of compute_worker's


def _unit_burst(backward: bool = True, batch: int | None = None):
    """The benchmarks' unit of compute: a tiny-deep layer's forward and backward at micro-batch 2, as a step
    computes a unit; without ``backward`` its forward alone (autograd recording, as the executor's)."""
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
