"""How long each lesson notebook takes to run top to bottom (target: under 3 minutes each
on the 2-core machine).

    python benchmarks/lessons_time.py [lessons/03_zero.ipynb ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((ROOT / "lessons").glob("*.ipynb"))
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        NotebookClient(notebook, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        seconds = time.perf_counter() - start
        print(f"{path.name:<32}{seconds:>7.1f} s  {'ok' if seconds < 180 else 'OVER 3 MINUTES'}", flush=True)


if __name__ == "__main__":
    main()
