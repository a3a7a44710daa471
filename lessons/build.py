"""Writes the lesson notebooks from their cells in lessons/source/ (edit there, then
`python lessons/build.py`). Notebooks are committed without outputs; the test suite runs each top to
bottom (tests/test_lessons.py)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

HERE = Path(__file__).parent
NAMES = ['01_data_parallel', '02_memory', '03_zero', '04_offload', '05_pipeline', '06_tensor_parallel', '07_calibrate',
         '08_deepspeed', '09_moe', '10_zeropp', '11_long_context', '12_zero_bubble',
         '13_precision']


def main() -> None:
    sys.path.insert(0, str(HERE.parent))  # so `lessons.source` imports when run as a script
    for name in NAMES:
        cells = importlib.import_module(f"lessons.source.lesson_{name}").CELLS
        notebook = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                      "language": "python"}})
        nbformat.write(notebook, HERE / f"{name}.ipynb")
        print(HERE / f"{name}.ipynb")


if __name__ == "__main__":
    main()
