"""Every lesson runs top to bottom (nbclient), draws its figures with simpar.plots and states a
takeaway. Timing targets (under 3 minutes each on the 2-core machine) are printed by
benchmarks/lessons_time.py, not asserted here."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

LESSONS = sorted((Path(__file__).resolve().parents[1] / "lessons").glob("*.ipynb"))


def test_thirteen_lessons_each_built_from_its_source():
    from lessons.build import NAMES

    assert [p.stem[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, 14)]
    assert [p.stem for p in LESSONS] == NAMES


@pytest.mark.slow
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs(path):
    notebook = nbformat.read(path, as_version=4)
    sources = "\n".join(cell.source for cell in notebook.cells)
    assert "plots." in sources, "figures come from simpar.plots"
    assert any(cell.cell_type == "markdown" and "## Takeaway" in cell.source for cell in notebook.cells)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    images = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the lesson drew no figure"
