"""What one rank measures while it performs its Plan: wall time of every op, and bytes held per
memory (gpu/host) and category, in the simulator's terms so the two can be compared.

Bytes are counted from the tensors the executor holds, by storage (views of one buffer count
once), sampled after every op; activations are the tensors autograd saves for backward, seen
through saved-tensor hooks (parameters, which autograd also saves, are left out). On a GPU the
allocator's own peak is reported beside them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

import torch

from simpar.plan import op_class


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view adds nothing to its base)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None and tensor.numel():
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class SavedActivations:
    """Tensors autograd keeps for backward, per (unit, micro-batch), counted by storage."""

    def __init__(self, parameters: Iterable[torch.Tensor]):
        # by storage, looked up when a tensor is saved: autograd often saves a view of a weight (a Linear's
        # transposed weight), a new tensor object over the parameter's memory, and ZeRO-3 swaps a
        # parameter's memory for its gathered whole: both are parameters, not activations
        self._parameter_list = list(parameters)
        self._owners: dict[int, set] = defaultdict(set)  # storage pointer -> keys that saved it
        self._sizes: dict[int, int] = {}
        self._keys: dict[tuple, set[int]] = defaultdict(set)

    def hooks(self, key: tuple) -> torch.autograd.graph.saved_tensors_hooks:
        def pack(tensor):
            storage = tensor.untyped_storage() if tensor.numel() else None
            parameters = {p.untyped_storage().data_ptr() for p in self._parameter_list if p.numel()}
            if storage is not None and storage.data_ptr() not in parameters:
                self._sizes[storage.data_ptr()] = storage.nbytes()
                self._owners[storage.data_ptr()].add(key)
                self._keys[key].add(storage.data_ptr())
            return tensor
        return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)

    def hold(self, key: tuple, tensor: torch.Tensor) -> None:
        """A tensor kept for ``key``'s backward outside autograd (the TP cross-entropy's logits and
        probabilities): an activation all the same."""
        storage = tensor.untyped_storage()
        self._sizes[storage.data_ptr()] = storage.nbytes()
        self._owners[storage.data_ptr()].add(key)
        self._keys[key].add(storage.data_ptr())

    def release(self, key: tuple) -> None:
        """The backward of ``key`` has run: what it alone saved is free."""
        for pointer in self._keys.pop(key, ()):
            self._owners[pointer].discard(key)
            if not self._owners[pointer]:
                del self._owners[pointer], self._sizes[pointer]

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())


def timeline_seconds(timeline: list[dict]) -> dict[int, float]:
    """Each op's seconds in ``timeline``, its entries summed."""
    seconds: dict[int, float] = defaultdict(float)
    for entry in timeline:
        seconds[entry["op"]] += entry["end"] - entry["start"]
    return dict(seconds)


class Recorder:
    """Op timeline and memory peaks of one rank over the steps it runs."""

    def __init__(self, device: torch.device):
        self.device = device
        self.timeline: list[dict] = []  # the last step's ops: {op, stream, class, start, end}
        self.step_times: list[float] = []
        # each op's seconds summed over the steps after the first (the warm-up, as the step time leaves it
        # out): one step is one draw of a machine whose steps spread by tens of percent (docs/calibration.md)
        self.op_seconds: dict[int, float] = defaultdict(float)
        self.peaks: dict[tuple[str, str], int] = defaultdict(int)  # (memory, category) -> bytes
        self.peak_total: dict[str, int] = defaultdict(int)  # memory -> the largest sum at one sample
        self._t0 = 0.0

    @property
    def step_started(self) -> float:
        """The clock at the current (or last) step's start: the timeline's times are after it."""
        return self._t0

    def clock(self) -> float:
        if self.device.type == "cuda":  # kernels run asynchronously: time what has finished
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start_step(self) -> None:
        self.timeline = []
        self._t0 = self.clock()

    def end_step(self) -> None:
        self.step_times.append(self.clock() - self._t0)

    def time_op(self, op, started: float, until: float | None = None) -> None:
        """``op`` ran from ``started`` until ``until`` (now if None); an op timed in two stretches (a TP piece
        and its continuation after the all-reduce) has two entries, its seconds summed."""
        kind = op_class(op)
        if kind is not None:
            ended = self.clock() if until is None else until
            self.timeline.append({"op": op.id, "stream": op.stream, "class": kind,
                                  "start": started - self._t0, "end": ended - self._t0})
            if self.step_times:  # a step after the first
                self.op_seconds[op.id] += self.timeline[-1]["end"] - self.timeline[-1]["start"]

    def op_means(self) -> dict[int, float]:
        """Each timed op's mean seconds over the steps after the first (the last step's alone if only one ran)."""
        steps = len(self.step_times) - 1
        if steps < 1:
            return timeline_seconds(self.timeline)
        return {op: seconds / steps for op, seconds in self.op_seconds.items()}

    def sample(self, held: dict[tuple[str, str], list | int]) -> None:
        """``held``: (memory, category) -> the tensors held there now (or a byte count)."""
        totals: dict[str, int] = defaultdict(int)
        for key, tensors in held.items():
            nbytes = tensors if isinstance(tensors, int) else storage_bytes(tensors)
            self.peaks[key] = max(self.peaks[key], nbytes)
            totals[key[0]] += nbytes
        for memory, nbytes in totals.items():
            self.peak_total[memory] = max(self.peak_total[memory], nbytes)

    def report(self) -> dict:
        categories = ("params", "grads", "optimizer", "activations", "buffers", "temporaries")
        memory = {c: self.peaks[("gpu", c)] for c in categories}
        memory["peak"] = self.peak_total["gpu"]
        memory["host"] = self.peak_total["host"]
        memory["nvme"] = self.peak_total["nvme"]
        if self.device.type == "cuda":
            memory["device_peak"] = torch.cuda.max_memory_allocated(self.device)
        return memory
