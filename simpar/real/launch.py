"""Run one process per rank with torch.distributed, and never leave one behind.

``launch(worker, world, args)`` starts ``world`` processes (forked from a fork server: ``_rank_context``), each
joining a process group on a free local port, and calls ``worker(ctx, *args)`` in each, where
``ctx`` knows the rank and world and records which op the rank is in (``with ctx.op("..."):``).
It returns the workers' results in rank order.

Faults: a rank that raises, dies or hangs ends the whole run within ``timeout`` seconds; every
child is killed and reaped, and the error names the rank and the op it was in. A port taken
between choosing and binding it is retried on another. Ctrl-C, SIGTERM and SIGHUP (raised as
exceptions by the CLI) tear the children down too, and a rank dies with simpar if simpar is killed.
Gloo ranks run beside one idle-priority spinner per core, which keeps an idle core from halting and
waking a blocked receive a 4 ms tick late (awake.py).
"""

from __future__ import annotations

import ctypes
import os
import queue
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from simpar.errors import SimparError
from simpar.real.allocator import keep_freed_memory
from simpar.real.awake import cores_kept_awake

_OP_CHARS = 160
_PORT_TRIES = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankContext:
    """What a worker knows about itself; ``op`` labels let a fault name where it happened."""

    rank: int
    world: int
    backend: str
    _ops: object  # shared char array, _OP_CHARS per rank
    _steps: object = None  # shared int array: steps each rank has finished (for progress)
    _view: memoryview = field(init=False, repr=False)  # _ops as bytes: what _set writes through

    def __post_init__(self):
        self._view = memoryview(self._ops).cast("B")

    def op(self, label: str) -> _OpLabel:
        return _OpLabel(self, label)

    def step_done(self) -> None:
        """Count a finished training step (the parent's progress bar reads it)."""
        if self._steps is not None:
            self._steps[self.rank] += 1

    def _set(self, label: str) -> None:
        # through a byte view: a ctypes slice assignment, item by item, took 6.6 us, twice an op, and at 2 ranks
        # slowed the executor's tp step (96 ops) by 13-18 % against its pieces and calls bare
        data = label.encode()[:_OP_CHARS - 1] + b"\0"  # the reader stops at the first NUL
        start = self.rank * _OP_CHARS
        self._view[start:start + len(data)] = data


class _OpLabel:
    def __init__(self, ctx: RankContext, label: str):
        self.ctx, self.label = ctx, label

    def __enter__(self):
        self.ctx._set(self.label)

    def __exit__(self, *exc):
        if exc[0] is None:  # on an exception, keep the label: the parent reports it
            self.ctx._set("")


def _die_with_simpar(watch) -> None:
    """End this rank when simpar ends, however it ends (SIGKILL included): a thread blocks on the
    read end of a pipe whose only write end simpar holds, and the kernel closes it when simpar dies.
    (The rank's parent may be the fork server, not simpar: ``_rank_context``.)"""
    def wait_for_eof():
        try:
            watch.recv_bytes()
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=wait_for_eof, daemon=True, name="simpar-watch").start()


def _entry(rank, world, port, backend, timeout, worker, args, results, ops, steps, watch):
    _die_with_simpar(watch)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # One thread per rank: torch is imported (and its thread pool sized to every core) before this
    # runs, and several ranks' OpenMP pools spin-waiting on the same cores slow compute 100-fold.
    torch.set_num_threads(1)
    keep_freed_memory()  # a step pays no page faults, as on a GPU's caching allocator (allocator.py)
    ctx = RankContext(rank, world, backend, ops, steps)
    try:
        if backend == "nccl":  # one GPU per rank
            torch.cuda.set_device(rank % torch.cuda.device_count())
        ctx._set("init_process_group")
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        ctx._set("")
        results.put((rank, "ok", _portable(worker(ctx, *args), torch.Tensor, lambda t: t.detach().cpu().numpy())))
        # no rank leaves before every rank has joined: a rank whose group is still connecting its pairs fails
        # when a peer that returned at once closes them ("connectFullMesh failed ... closed by peer"). This rank
        # has reported: a peer that never comes is the peer's failure (named by the parent), not this one's
        try:
            dist.barrier()
        except RuntimeError:
            pass
    except BaseException as exc:  # report everything, including SystemExit from the worker
        text = f"{type(exc).__name__}: {exc}".strip()
        results.put((rank, "error", text, traceback.format_exc(limit=6)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(worker, world: int, args: tuple = (), timeout: float = 120.0, backend: str = "gloo",
           progress=None) -> list:
    """Run ``worker(ctx, *args)`` on ``world`` ranks; return their results in rank order.
    ``progress(steps)`` is called with the steps all ranks have finished so far (``ctx.step_done``),
    whenever that number grows (for a progress bar)."""
    for attempt in range(_PORT_TRIES):
        try:
            return _launch_once(worker, world, args, timeout, backend, free_port(), progress)
        except _PortTaken:
            if attempt == _PORT_TRIES - 1:
                raise SimparError("launch: could not bind a free local port after 3 tries") from None
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _launch_once(worker, world, args, timeout, backend, port, progress) -> list:
    # gloo ranks share this machine's cores: keep them out of the idle state whose wake-ups cost a
    # 4 ms tick on a VM (awake.py); a GPU rank's waits are the GPU's, not this machine's
    with cores_kept_awake(backend == "gloo"):
        return _run_ranks(worker, world, args, timeout, backend, port, progress)


def _rank_context():
    """How ranks start: forked from a server that imported torch and simpar once (a fresh interpreter per
    rank, as spawn starts, imports torch anew: seconds of CPU a rank, 16 ranks' worth on a few cores), and
    spawned where a platform has no fork server. A forked rank is as fresh as a spawned one: the server
    runs no op, so no thread pool or CUDA context exists to inherit."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "simpar.real.prewarm"])
    return ctx


def _run_ranks(worker, world, args, timeout, backend, port, progress) -> list:
    ctx = _rank_context()
    results = ctx.Queue()
    ops = ctx.Array(ctypes.c_char, _OP_CHARS * world, lock=False)
    steps = ctx.Array(ctypes.c_int, world, lock=False)
    watch, simpar_alive = ctx.Pipe(duplex=False)  # simpar keeps the write end: its death reads as EOF
    procs = [ctx.Process(target=_entry, args=(r, world, port, backend, timeout, worker, args, results, ops, steps,
                                              watch), name=f"simpar-rank{r}") for r in range(world)]
    reported = 0
    for p in procs:
        p.start()
    watch.close()
    outcome: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    finished = False
    try:
        while len(outcome) < world:
            try:
                message = results.get(timeout=0.2)
            except queue.Empty:
                message = None
            if message is not None:
                rank, status = message[0], message[1]
                if status == "error":
                    if "address already in use" in message[2].lower():
                        raise _PortTaken()
                    raise SimparError(f"rank {rank} failed{_where(ops, rank)}: {message[2]}")
                outcome[rank] = _portable(message[2], np.ndarray, torch.from_numpy)
                continue
            if progress and sum(steps) > reported:
                reported = sum(steps)
                progress(reported)
            for rank, p in enumerate(procs):
                if rank not in outcome and p.exitcode is not None and p.exitcode != 0:
                    raise SimparError(f"rank {rank} died{_where(ops, rank)} with exit code {p.exitcode}")
            if time.monotonic() > deadline:
                late = [r for r in range(world) if r not in outcome]
                where = "; ".join(f"rank {r}{_where(ops, r)}" for r in late)
                raise SimparError(f"--timeout: {len(late)} rank(s) did not finish within {timeout:g} s: {where}")
        finished = True
        return [outcome[r] for r in range(world)]
    finally:  # on any failure, signal or Ctrl-C too: kill at once; after success let the ranks exit
        _reap(procs, grace=2.0 if finished else 0.0)
        results.close()
        simpar_alive.close()


def _portable(value, kind, convert):
    """Tensors cross the queue as numpy arrays: a tensor sent by torch's queue lives in the
    sender's shared memory, which is gone once the rank exits."""
    if isinstance(value, kind):
        return convert(value)
    if isinstance(value, dict):
        return {k: _portable(v, kind, convert) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_portable(v, kind, convert) for v in value)
    return value


def _where(ops, rank: int) -> str:
    label = bytes(ops[rank * _OP_CHARS:(rank + 1) * _OP_CHARS]).split(b"\0", 1)[0].decode(errors="replace")
    return f" in {label}" if label else ""


def _reap(procs, grace: float) -> None:
    """Give ranks ``grace`` seconds to exit; kill the rest; wait for every one."""
    end = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join()
