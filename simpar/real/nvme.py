"""ZeRO-Infinity's third tier for the executor: tensors written to and read back from files.

A rank keeps its parameter shards and optimizer states in a private directory (the machine's
local disk standing in for NVMe) between uses, so the bytes really leave memory and come back.
Bytes are counted as tensor bytes (the files add a small pickle header, not counted).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch


class NVMeStore:
    def __init__(self, rank: int):
        self.directory = Path(tempfile.mkdtemp(prefix=f"simpar-nvme-rank{rank}-"))
        self.held: dict[str, int] = {}  # name -> tensor bytes stored

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.pt"

    def write(self, name: str, tensors: dict[str, torch.Tensor]) -> int:
        """Store ``tensors`` under ``name``; returns the tensor bytes written."""
        torch.save({k: t.detach().clone() for k, t in tensors.items()}, self._path(name))
        self.held[name] = sum(t.numel() * t.element_size() for t in tensors.values() if t.dim())
        return self.held[name]

    def read(self, name: str) -> dict[str, torch.Tensor]:
        return torch.load(self._path(name))

    def nbytes(self, prefix: str) -> int:
        return sum(v for name, v in self.held.items() if name.startswith(prefix))

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
