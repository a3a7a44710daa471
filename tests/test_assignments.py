"""Each assignment's grader is real: it passes simpar's reference solution, fails the untouched
student stub, and fails every planted bug (tests/assignment_bugs/aN_*.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUGS = Path(__file__).with_name("assignment_bugs")
ASSIGNMENTS = {"a1": True, "a2": False, "a3": False, "a4": True, "a5": True, "a6": False}  # True: the grader runs gloo ranks (slow)


def grade(assignment: str, solution: str | None, stop_at_first: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SIMPAR_SOLUTION"}
    if solution:
        env["SIMPAR_SOLUTION"] = solution
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"assignments/{assignment}"]
    return subprocess.run(command + (["-x"] if stop_at_first else []), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def cases():
    for name, slow in ASSIGNMENTS.items():
        marks = [pytest.mark.slow] if slow else []
        yield pytest.param(name, "reference", marks=marks, id=f"{name}-reference")
        yield pytest.param(name, "stub", marks=marks, id=f"{name}-stub")
        bugs = sorted(BUGS.glob(f"{name}_*.py"))
        assert len(bugs) >= 2, f"{name} needs at least two planted bugs"
        for bug in bugs:
            yield pytest.param(name, str(bug), marks=marks, id=bug.stem)


@pytest.mark.parametrize("assignment, solution", list(cases()))
def test_grader(assignment, solution):
    if solution == "reference":
        result = grade(assignment, f"instructor.solutions.{assignment}")
        assert result.returncode == 0, result.stdout[-3000:]
        assert " passed" in result.stdout and "skipped" not in result.stdout
        return
    result = grade(assignment, None if solution == "stub" else solution, stop_at_first=True)
    # 1: tests ran and failed (not 2/3/4: interrupted, internal error, usage error; not 5: none collected)
    assert result.returncode == 1, result.stdout[-3000:]
    if solution == "stub":
        assert "NotImplementedError" in result.stdout
