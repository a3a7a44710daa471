"""Which solution a grader grades: the student's file beside the grader, or the one named by the
``SIMPAR_SOLUTION`` environment variable (a module such as ``instructor.solutions.a1`` or a
path to a .py file). The variable lets a teacher grade any file, and simpar's own tests prove a
grader passes the reference and fails the stub and planted bugs."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

VARIABLE = "SIMPAR_SOLUTION"


def solution_spec(grader_file: str, student_file: str) -> str:
    """The solution to grade, as a string a child process can load again."""
    return os.environ.get(VARIABLE) or str(Path(grader_file).with_name(student_file))


def load(spec: str) -> ModuleType:
    """A module by dotted name, or from a file path."""
    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec).resolve()
        name = f"solution_{path.parent.name}_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or not path.exists():
            raise FileNotFoundError(f"{VARIABLE}: no solution file {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def load_solution(grader_file: str, student_file: str) -> ModuleType:
    return load(solution_spec(grader_file, student_file))
