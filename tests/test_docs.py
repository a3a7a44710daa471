"""Every command in the README and docs/ runs: each line of a ```bash block is run as written, or in
the smaller form SMOKE gives it where it would take minutes (or installs, or needs a second
machine); every ```yaml block is a valid cluster file. A documented command that neither runs nor
has a smoke form fails this test, and so does a smoke form whose command left the docs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simpar.topologies.cluster_file import parse

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = ["examples", "instructor", "assignments", "tests", "lessons", "benchmarks", "validation"]

# documented command -> what the test runs instead (None: not run, with the reason as the value's comment)
SMOKE = {
    # installs and the test suite itself: the suite is what runs this file
    "pip install torch==2.13.0 && pip install -e . && simpar run --strategy zero2 --gpus 16 --model gpt2-xl "
    "--topology dgx-a100": "simpar run --strategy zero2 --gpus 16 --model gpt2-xl --topology dgx-a100",
    "pip install torch==2.13.0 && pip install -e '.[dev,lessons]' && python -m pytest -q": None,
    "pip install -e '.[lessons]'": None,
    # minutes of real runs or calibration on 2 cores: the same commands, smaller
    "simpar run --strategy zero2 --gpus 16 --compare-real": "simpar run --strategy zero2 --gpus 2 --compare-real",
    "simpar calibrate": "simpar calibrate --gpus 2 --repeats 1 --out cal.json",
    # (the session's cached profile, or a calibration first if this test runs alone)
    "simpar validate --repeats 3":
        "simpar validate --gpus 2 --strategies ddp --steps 2 --seconds 0 --repeats 2 --calibrate-after none "
        "--out validation.md",
    "simpar run --strategy zero3 --gpus 8 --hardware ~/.cache/simpar/hardware-HOST-torchVERSION-fp32.json":
        "simpar calibrate --quick --gpus 2 --out cal.json && simpar run --strategy zero3 --gpus 8 "
        "--hardware cal.json",
    "simpar search --model gpt3-175b --gpus 1024 --topology dgx-a100 --top 5":
        "simpar search --model gpt3-175b --gpus 1024 --topology dgx-a100 --top 5 --strategies 3d --global-batch 512",
    # a second machine: the one-machine form above it in the same page runs instead
    "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m simpar.real.torchrun "
    "--strategy zero2 --gpus 16": None,
    # opens a server until stopped (tests/test_course_packaging.py runs and ends one)
    "simpar lessons": "simpar lessons --copy-only --dir course",
}
SLOW = ("--compare-real", "calibrate", "validate", "torchrun", "pytest", "gpt3-175b", "search", "ablation")
# (the --engine deepspeed command needs the deepspeed extra; CI installs it, and the docs test runs it there)


def commands() -> list[tuple[str, str, bool]]:
    """(page, command, expected to fail) for every command line of every bash block."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                text, _, comment = line.partition(" #")
                text = " ".join(text.split())
                if text and not text.startswith("#"):
                    found.append((page.name, text, "fails" in comment))
    return found


def test_every_smoke_form_is_for_a_documented_command():
    documented = {command for _, command, _ in commands()}
    assert set(SMOKE) <= documented, set(SMOKE) - documented


def cases():
    seen = set()
    for page, command, fails in commands():
        run = SMOKE.get(command) or command
        if (run, fails) in seen:  # the same command on another page: run once
            continue
        seen.add((run, fails))
        marks = [pytest.mark.slow] if any(word in run for word in SLOW) else []
        yield pytest.param(command, fails, marks=marks, id=f"{page}: {command[:70]}")


@pytest.mark.parametrize("command,fails", list(cases()))
def test_documented_command_runs(tmp_path, command, fails):
    run = SMOKE.get(command, command)
    if run is None:
        pytest.skip("an install, the suite itself, or a second machine: see SMOKE")
    if "--engine deepspeed" in run and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs the deepspeed extra: pip install 'simpar[deepspeed]'")
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    # the session's private cache (conftest.py): as on a user's machine, only the first --compare-real calibrates;
    # and as there, DeepSpeed's CPU Adam is built once, not under each test's home (half a minute a build)
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    env = dict(os.environ, HOME=str(tmp_path), SIMPAR_CACHE=os.environ["SIMPAR_CACHE"], MPLBACKEND="Agg",
               TORCH_EXTENSIONS_DIR=extensions,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    result = subprocess.run(["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600, stdin=subprocess.DEVNULL)
    output = (result.stdout + result.stderr)[-3000:]
    if fails:
        assert result.returncode != 0, output
    else:
        assert result.returncode == 0, output
        assert "Traceback" not in result.stderr, output


@pytest.mark.parametrize("page", [p for p in PAGES if "```yaml" in p.read_text()], ids=lambda p: p.name)
def test_documented_cluster_files_read(page):
    blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
    for block in blocks:
        cluster = parse(yaml.safe_load(block), page.name)
        assert cluster.build().gpus
