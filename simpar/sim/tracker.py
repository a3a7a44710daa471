"""Memory per rank per category over time, from a Plan's Alloc/Free ops.

Ranks of one Program allocate identically, so one tracker serves them all. GPU memory is what
capacity is checked against; host and NVMe bytes are tracked per rank beside it.
"""

from __future__ import annotations

from collections import defaultdict

from simpar.plan import CATEGORIES, Alloc, Free, Program


class MemoryTracker:
    def __init__(self):
        self.current: dict[tuple[str, str], int] = defaultdict(int)  # (memory, category) -> bytes
        self.peak_by_category: dict[tuple[str, str], int] = defaultdict(int)
        self.peak = {"gpu": 0, "host": 0, "nvme": 0}
        self.at_peak: dict[str, int] = {}  # GPU categories at the moment of the GPU peak
        self.timeline: list[tuple[float, int]] = []  # (time, GPU bytes in use)
        self.by_category: list[tuple[float, list[int]]] = []  # (time, GPU bytes per CATEGORIES)

    def apply(self, op, now: float = 0.0) -> None:
        sign = 1 if isinstance(op, Alloc) else -1
        key = (op.memory, op.category)
        self.current[key] += sign * op.nbytes
        self.peak_by_category[key] = max(self.peak_by_category[key], self.current[key])
        total = sum(v for (memory, _), v in self.current.items() if memory == op.memory)
        if op.memory == "gpu":
            self.timeline.append((now, total))
            self.by_category.append((now, [self.current[("gpu", c)] for c in CATEGORIES]))
        if total > self.peak[op.memory]:
            self.peak[op.memory] = total
            if op.memory == "gpu":
                self.at_peak = {c: self.current[("gpu", c)] for c in CATEGORIES}

    def report(self) -> dict:
        """Per category the most it ever held, the peak of the total, and host/NVMe peaks."""
        out = {c: self.peak_by_category[("gpu", c)] for c in CATEGORIES}
        out["peak"] = self.peak["gpu"]
        out["host"] = self.peak["host"]
        out["nvme"] = self.peak["nvme"]
        return out


def walk(program: Program) -> MemoryTracker:
    """Memory in program order (op by op as written), without timing: cheap enough to try
    every strategy when one does not fit."""
    tracker = MemoryTracker()
    for op in program.ops:
        if isinstance(op, (Alloc, Free)):
            tracker.apply(op)
    return tracker
