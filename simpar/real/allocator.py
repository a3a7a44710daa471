"""Keep a rank's freed host memory for reuse, as a GPU framework's caching allocator keeps device memory.

PyTorch on a GPU takes memory from the driver once and reuses it (the CUDA caching allocator), so a
step pays nothing to the operating system. On a CPU, torch's tensors come from glibc's ``malloc``,
which serves large blocks with fresh ``mmap`` pages and gives freed memory back to the kernel; the
next step then touches new pages again, one page fault per 4 KiB. On the development VM a page fault
costs 5 us (first touch 10.3 ms for 2,000 pages, against 0.33 ms touching them again), and a 2-rank
DDP step of tiny-deep took 0-2,300 faults per rank, changing from step to step and from one rank to
the other (glibc's threshold for mmap moves with what was freed before): up to 10 ms of a 35 ms step.
Adam on 1M fp32 parameters ran at 95 M params/s in one process and 265-400 M/s in the next, the
same code, as its temporaries did or did not land on fresh pages.

``keep_freed_memory()`` asks glibc (``mallopt``) never to serve a block from mmap and never to give
the heap back, so after the first steps (the heap grows to the step's peak) a step takes no page
faults, like the GPU's allocator after its first step. Every rank process of the executor and of the
calibration calls it first, so both measure the same steady state. Memory is still counted from the
tensors held (``instrument.py``), not from the process's resident size, so the counts do not change.
The cost is a heap that only grows: glibc 2.36 places a 64-byte-aligned block (torch's) freshly at the
top when no free chunk is aligned to suit, so a loop of one large tensor can grow it for a while; a
step's mix of sizes settles (ZeRO-1, 2 ranks, 120 steps: 338 -> 340 MiB resident after the first steps).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h> parameter numbers
NEVER_TRIM = 2**31 - 1  # bytes free at the heap's top before glibc returns them (mallopt takes an int): 2 GiB


def keep_freed_memory() -> bool:
    """Set this process's glibc malloc to reuse freed memory; False where there is no glibc (macOS:
    its allocator is left as it is)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
