"""Micro-benchmarks of one GPU (and of NCCL between GPUs) in the terms of simpar's kernel model.

- GEMMs: the very shapes simpar prices (``costs.kernels.unit_kernels`` of Megatron layers and heads
  at several hidden sizes, micro-batches and TP degrees, forward and backward), each run as the
  ``torch.matmul`` / ``torch.bmm`` it stands for; on a GPU with FP8 tensor cores (compute capability
  8.9 or more) the layers' linear GEMMs of fp8-mixed too, as ``torch._scaled_mm`` of two float8_e4m3
  operands with per-tensor scales into bf16 (what Transformer Engine's FP8 GEMM runs).
- Streaming kernels: ``torch.add(a, b, out=c)`` (two reads and a write) from 8 KiB to 1.5 GiB,
  queued back to back as a training step queues them, so the small ones show the per-kernel overhead
  and the large ones the HBM bandwidth.
- NCCL: all-reduce by message size across every GPU of the machine (one process each).

Timing: CUDA events around a CUDA graph of ``repeats`` launches after warm-up, the median of 5
rounds (the GPU's time per kernel, without Python's dispatch; NCCL calls are timed eagerly). Every
function also runs on the CPU (``device="cpu"``, wall clock) so the code path is tested where no GPU
is at hand; only CUDA figures go into a profile.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from simpar.costs.gpu import Gemm
from simpar.costs.kernels import Shape, unit_kernels
from simpar.models.spec import ModelSpec

ROUNDS = 5
# Megatron GPT shapes (seq 2048, vocab 51,200) spanning the published rows' hidden sizes
HIDDEN_HEADS = ((2048, 16), (4096, 32), (8192, 64))
MICRO_BATCHES = (1, 4)
TP_DEGREES = (1, 2, 8)
STREAM_ELEMENTS = tuple(2**k for k in range(12, 30, 2))  # 4 Ki to 256 Mi elements
ALLREDUCE_BYTES = tuple(2**k for k in range(16, 31, 2))  # 64 KiB to 1 GiB


def _dtype(itemsize: int):
    return {2: torch.bfloat16, 4: torch.float32}[itemsize]


def timed(fn, repeats: int, device: str) -> float:
    """Seconds per call of ``fn``: the median over rounds of ``repeats`` back-to-back calls. On CUDA
    the calls are captured in a CUDA graph and replayed, so what is timed is the GPU's own time per
    kernel (as in a training step, where the CPU queues kernels ahead of the GPU), not Python's
    dispatch (``eager_interval`` measures that)."""
    if device != "cuda":
        return _rounds(fn, repeats, device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graphs require
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    return _rounds(graph.replay, 1, device) / repeats


def eager_interval(device: str = "cuda", repeats: int = 2000) -> float:
    """Seconds between kernels that eager PyTorch launches one after another when each is tiny (the
    CPU's dispatch rate: a step of kernels shorter than this is CPU-bound)."""
    a = torch.zeros(1, device=device)
    return _rounds(lambda: torch.add(a, a, out=a), repeats, device)


def _rounds(fn, repeats: int, device: str) -> float:
    for _ in range(2):
        fn()
    rounds = []
    for _ in range(ROUNDS):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            end.synchronize()
            rounds.append(start.elapsed_time(end) / 1e3 / repeats)
        else:
            begin = time.perf_counter()
            for _ in range(repeats):
                fn()
            rounds.append((time.perf_counter() - begin) / repeats)
    return statistics.median(rounds)


def megatron_gemms(hidden_heads=HIDDEN_HEADS, micro_batches=MICRO_BATCHES, tp_degrees=TP_DEGREES,
                   seq: int = 2048, vocab: int = 51200, fp8: bool = False) -> list[Gemm]:
    """The distinct GEMMs of Megatron layers and heads (forward and backward) over the given shapes; with
    ``fp8`` the layers' linear GEMMs of fp8-mixed alone (the FP8 ones)."""
    seen: dict[tuple, Gemm] = {}
    for hidden, heads in hidden_heads:
        model = ModelSpec(f"h{hidden}", 1, hidden, heads, 4 * hidden, vocab, seq)
        for mb in micro_batches:
            for tp in tp_degrees:
                shape = Shape(model, mb, tp, fp8=fp8)
                for kind in ("layer", "head"):
                    for phase in ("fwd", "bwd"):
                        for kernel in unit_kernels(shape, kind, phase):
                            if isinstance(kernel, Gemm) and kernel.io_bytes is None and kernel.fp8 == fp8:
                                seen.setdefault((kernel.m, kernel.n, kernel.k, kernel.batch, kernel.itemsize),
                                                kernel)
    return list(seen.values())


def gemm_seconds(gemms, device: str = "cuda", budget_s: float = 0.02) -> list[dict]:
    """Each GEMM's measured seconds; ``budget_s`` of work per round sets the repeats."""
    rows = []
    for g in gemms:
        dtype = _dtype(g.itemsize)
        shape_a = (g.batch, g.m, g.k) if g.batch > 1 else (g.m, g.k)
        shape_b = (g.batch, g.k, g.n) if g.batch > 1 else (g.k, g.n)
        a = torch.randn(shape_a, device=device, dtype=dtype)
        b = torch.randn(shape_b, device=device, dtype=dtype)
        out = torch.empty(shape_a[:-1] + (g.n,), device=device, dtype=dtype)
        estimate = g.flops / (5e14 if device == "cuda" else 5e10)
        repeats = max(1, min(200, int(budget_s / max(estimate, 1e-9))))
        seconds = timed(lambda: torch.matmul(a, b, out=out), repeats, device)
        rows.append({"name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "itemsize": g.itemsize,
                     "seconds": seconds})
        del a, b, out
    return rows


def fp8_supported(device: str = "cuda") -> str | None:
    """None where FP8 GEMMs run here, else why not."""
    if device != "cuda":
        return None  # (torch's CPU _scaled_mm: the code path, for the tests)
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return f"compute capability {major}.{minor} has no FP8 tensor cores (8.9 or more: Ada, Hopper, Blackwell)"
    return None


def fp8_gemm_seconds(gemms, device: str = "cuda", budget_s: float = 0.02) -> list[dict]:
    """Each FP8 GEMM's measured seconds: float8_e4m3 operands, per-tensor scales, bf16 output
    (``torch._scaled_mm``, which wants the second operand column-major)."""
    rows = []
    for g in gemms:
        if g.batch != 1 or g.m % 16 or g.n % 16 or g.k % 16:  # (FP8 GEMMs need dimensions in 16s)
            continue
        a = torch.randn(g.m, g.k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(g.n, g.k, device=device).to(torch.float8_e4m3fn).t()
        scale = torch.ones((), device=device)
        estimate = g.flops / (1e15 if device == "cuda" else 5e10)
        repeats = max(1, min(200, int(budget_s / max(estimate, 1e-9))))
        seconds = timed(lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16),
                        repeats, device)
        rows.append({"name": g.name, "m": g.m, "n": g.n, "k": g.k, "batch": 1, "itemsize": 1, "seconds": seconds})
        del a, b
    return rows


def stream_seconds(elements=STREAM_ELEMENTS, device: str = "cuda", itemsize: int = 2) -> list[dict]:
    """An element-wise add of n elements: 3·n·itemsize bytes per kernel."""
    rows = []
    for n in elements:
        a = torch.randn(n, device=device, dtype=_dtype(itemsize))
        b, c = torch.randn_like(a), torch.empty_like(a)
        repeats = max(10, min(500, int(2**27 // n)))
        seconds = timed(lambda: torch.add(a, b, out=c), repeats, device)
        rows.append({"elements": n, "bytes": 3 * n * itemsize, "seconds": seconds})
        del a, b, c
    return rows


def allreduce_worker(ctx, sizes=ALLREDUCE_BYTES, repeats: int = 20) -> list[dict]:
    """Run in every rank (``simpar.real.launch``): all-reduce of each size, seconds per call."""
    device = "cuda" if ctx.backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(ctx.rank % torch.cuda.device_count())
    rows = []
    for size in sizes:
        with ctx.op(f"all-reduce of {size} bytes"):
            buffer = torch.ones(size // 4, device=device, dtype=torch.float32)
            seconds = _rounds(lambda: dist.all_reduce(buffer), max(2, repeats * 2**24 // max(size, 2**24)), device)
            rows.append({"bytes": size, "seconds": seconds})
    return rows
