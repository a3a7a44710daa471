"""Run one process per rank with torch.distributed, and never leave one behind.

``launch(worker, world, args)`` spawns ``world`` processes (torch.multiprocessing, spawn), each
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
import ctypes.util
import os
import queue
import signal
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
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
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


def _die_with_parent(parent: int) -> None:
    """End this rank when simpar ends, however it ends (SIGKILL included): on Linux the kernel
    sends SIGKILL on the parent's death (prctl PR_SET_PDEATHSIG); elsewhere a thread watches for
    the rank being reparented."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch():
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(1)


def _entry(rank, world, port, backend, timeout, worker, args, results, ops, steps, parent):
    _die_with_parent(parent)
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


def _run_ranks(worker, world, args, timeout, backend, port, progress) -> list:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    ops = ctx.Array(ctypes.c_char, _OP_CHARS * world, lock=False)
    steps = ctx.Array(ctypes.c_int, world, lock=False)
    procs = [ctx.Process(target=_entry, args=(r, world, port, backend, timeout, worker, args, results, ops, steps,
                                              os.getpid()), name=f"simpar-rank{r}") for r in range(world)]
    reported = 0
    for p in procs:
        p.start()
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
