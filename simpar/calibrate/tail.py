"""The resume's tail: after a call, a rank's computes run slower for the rest of the stretch to its next call, not
only the first (the profile's ``resume``); the micro-benchmark that measures it and its fit.

Why: at 2 ranks on the development VM, tiny-deep's DDP step computed its forward layers 393-406 us each after
an all-reduce that moved 4 bytes, against 356-368 us in the same executor with the call left out (three
interleaved rounds; the call's own bytes made no difference: 372-403 us after the real one), and its
optimizer step 10-30 % slower: the ranks reach the call a millisecond or more apart (|skew| 1.3-1.6 ms on
average) and leave it together, the early one woken from a blocked receive. The calibration's pattern computes
one unit (a layer, hot in its core's cache) after each call: the first compute only. Two ranks
computing a step-like sequence on a shared clock without any call, together or half a period apart, differ by
0-4 % in the backward only (docs/calibration.md, the thirty-ninth stop).

``tail_worker`` computes that sequence (tiny-deep's layers forward one by one, the backward, an Adam step),
each repetition right after one of the executor's ring all-reduces of 4 bytes that one rank (in turn) reaches
``LAG`` late, or after the same lag with no call; the two interleaved in blocks against this machine's drift.
At 2 ranks the positions after the first took 3.2-4.8 % longer after the call in three runs of it, 2.1-6.5 %
in a validate window's three calibrations, most of it in the backward and the optimizer step (+134-297 and
+39-253 us), not fading over the 11 ms: ``fit_tail`` keeps that fraction, which the simulator charges every
compute after the first one after a call, up to the next (sim/op_costs.py).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from simpar.calibrate.bench import BURST_UNIT
from simpar.models import model
from simpar.real.comm import CountingComm
from simpar.real.model import build_model
from simpar.real.states import make_optimizer

# how late one rank reaches the call: about what tiny-deep's DDP step's ranks lag each other at 2 ranks, where
# its 4-byte all-reduce cost 3.2-3.8 ms (the early rank waiting); with no lag the ranks reach their calls
# together and the positions after the first took -1.2 to +1.4 % longer after the call (three runs): noise.
# Without the call the lag leaves the ranks apart; after it they compute side by side, as a step's do: the
# fraction holds both, the wake and the two ranks' working sets meeting in the shared caches
LAG = 3e-3
REPETITIONS = 10  # of each kind a round, back to back


def tail_worker(ctx, rounds: int) -> dict:
    """{"call": [[s of each position] per repetition], "none": [...]}: positions the sequence's layers'
    forwards, the backward and the optimizer step, every rank's own (the late one's and the waiting ones')."""
    name, batch = BURST_UNIT
    spec = model(name)
    net = build_model(spec)
    layers = list(net.units[1:-1])
    hidden = torch.randn(batch, spec.seq, spec.hidden)
    optimizer = make_optimizer("adam", [p for layer in layers for p in layer.parameters()])  # the executor's
    comm, group, flat = CountingComm(ctx.rank), list(range(ctx.world)), torch.zeros(ctx.world)

    def sequence() -> list[float]:
        ends = [time.perf_counter()]
        out = hidden.detach().requires_grad_()
        for layer in layers:
            out = layer(out)
            ends.append(time.perf_counter())
        out.sum().backward()
        ends.append(time.perf_counter())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
        return [b - a for a, b in zip(ends, ends[1:])]

    for _ in range(5):  # a fresh process's first backwards take tens of milliseconds
        sequence()
    times: dict[str, list[list[float]]] = {"call": [], "none": []}
    dist.barrier()
    for _ in range(rounds):
        for kind in times:
            for rep in range(REPETITIONS):
                if ctx.rank == rep % ctx.world:
                    time.sleep(LAG)
                if kind == "call":
                    comm.ring_all_reduce(flat, group)
                times[kind].append(sequence())
    return times


def position_means(ranks: list[dict], kind: str) -> list[float]:
    """Each position's mean over every rank's repetitions of ``kind``."""
    return [statistics.fmean(column) for column in zip(*(rep for r in ranks for rep in r[kind]))]


def fit_tail(after_call: list[float], without: list[float]) -> float:
    """The fraction the positions after the first (the first pays the resume, priced apart) take longer after a
    call than without one, over their time without: at or below zero (noise) 0, kept so that an average of
    calibrations counts the one that saw none."""
    extra = sum(after_call[1:]) - sum(without[1:])
    return max(extra / sum(without[1:]), 0.0)
