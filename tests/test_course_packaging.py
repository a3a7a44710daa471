"""The course as students get it: the lessons open with one command, and an installed wheel ships
stubs, graders and lessons but never the reference solutions (instructor/)."""

from __future__ import annotations

import glob
import importlib.util
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from simpar.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_lessons_copy_into_a_working_folder_without_overwriting(tmp_path, capsys):
    assert main(["lessons", "--dir", str(tmp_path), "--copy-only"]) == 0
    notebooks = sorted(p.name for p in (tmp_path / "lessons").glob("*.ipynb"))
    assert notebooks == sorted(p.name for p in (ROOT / "lessons").glob("*.ipynb")) and len(notebooks) == 13
    assert (tmp_path / "assignments" / "a1" / "ring.py").read_text() == (ROOT / "assignments/a1/ring.py").read_text()
    assert (tmp_path / "assignments" / "a4" / "test_zero2.py").exists()
    assert (tmp_path / "assignments" / "a5" / "test_dispatch.py").exists()
    assert (tmp_path / "assignments" / "a6" / "test_zb_h1.py").exists()
    assert not list(tmp_path.rglob("*solution*")) and not (tmp_path / "instructor").exists()
    (tmp_path / "assignments" / "a1" / "ring.py").write_text("# my work\n")
    assert main(["lessons", "--dir", str(tmp_path), "--copy-only"]) == 0
    assert "(0 new file(s) copied)" in capsys.readouterr().out
    assert (tmp_path / "assignments" / "a1" / "ring.py").read_text() == "# my work\n"


def test_lessons_without_jupyterlab_say_how_to_install(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jupyterlab" else real(name, *a))
    assert main(["lessons", "--dir", str(tmp_path)]) == 2
    assert "pip install 'simpar[lessons]'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="needs the lessons extra (jupyterlab)")
def test_simpar_lessons_opens_jupyterlab_on_the_lessons():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "simpar", "lessons", "--no-browser", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen, deadline = [], time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if f":{port}/lab" in line or (f":{port}/" in line and "http" in line):
                break
        assert any(f":{port}/" in line for line in seen), "".join(seen[-20:])
        assert any(str(ROOT / "lessons") in line for line in seen), "".join(seen[-20:])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_an_installed_wheel_has_no_solutions(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "wheel")], check=True, cwd=tmp_path, capture_output=True)
    wheel = glob.glob(str(tmp_path / "wheel" / "*.whl"))[0]
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if "solution" in n or "instructor" in n]
    assert "simpar/course/adapter.py" in names
    assert sum(n.endswith(".ipynb") for n in names) == 13 and any(n.endswith("assignments/a1/ring.py") for n in names)
    assert any(n.endswith("assignments/a5/dispatch.py") for n in names)
    assert any(n.endswith("assignments/a6/zb_h1.py") for n in names)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                    wheel], check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    probe = ("import simpar, simpar.course.adapter; print(simpar.__file__)\n"
             "try:\n    import simpar.course.solutions\nexcept ModuleNotFoundError:\n    print('no solutions')\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == [str(tmp_path / "site" / "simpar" / "__init__.py"), "no solutions"]
