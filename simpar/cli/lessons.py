"""``simpar lessons``: open the lessons (and the assignments beside them) in JupyterLab.

In a checkout of the repository they open where they are. From an installed package they are
first copied into a working folder (default ./simpar-course), so a student's edits are their own;
files already there are never overwritten.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from simpar.errors import SimparError

INSTALL_HINT = "pip install 'simpar[lessons]' (in a checkout: pip install -e '.[lessons]')"


def register(sub) -> None:
    p = sub.add_parser("lessons", help="open the lessons in JupyterLab (needs the 'lessons' extra)",
                       description="Open the lessons in JupyterLab. From an installed package the lessons and "
                                   f"assignments are first copied into --dir. Needs JupyterLab: {INSTALL_HINT}.")
    p.add_argument("--dir", help="working folder for an installed package's lessons and assignments "
                                 "(default ./simpar-course; a checkout opens its own lessons/)")
    p.add_argument("--no-browser", action="store_true", help="start the server without opening a browser")
    p.add_argument("--port", help="port for the server (default: JupyterLab's, 8888 or the next free one)")
    p.add_argument("--copy-only", action="store_true", help="copy the lessons and assignments, print where, stop")
    p.set_defaults(handler=run)


def course_root() -> Path:
    """Where the lessons/ and assignments/ folders are: the repository (a checkout, editable
    install) or the data the wheel installed (share/simpar)."""
    checkout = Path(__file__).resolve().parents[2]
    candidates = [checkout, Path(sysconfig.get_paths()["data"]) / "share" / "simpar",
                  Path(sys.prefix) / "share" / "simpar"]
    for root in candidates:
        if (root / "lessons").is_dir() and any((root / "lessons").glob("*.ipynb")):
            return root
    raise SimparError("lessons: cannot find the lesson notebooks; reinstall simpar (they ship in share/simpar)")


def copy_course(root: Path, target: Path) -> int:
    """Copy lessons/*.ipynb and assignments/ under ``target``; return how many files were new."""
    copied = 0
    for folder, pattern in (("lessons", "*.ipynb"), ("assignments", "**/*")):
        for source in sorted((root / folder).glob(pattern)):
            if not source.is_file() or "__pycache__" in source.parts:
                continue
            destination = target / source.relative_to(root)
            if destination.exists():
                continue  # a student's own work
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
            copied += 1
    return copied


def run(args) -> int:
    root = course_root()
    in_checkout = root == Path(__file__).resolve().parents[2] and args.dir is None
    if in_checkout:
        folder = root / "lessons"
    else:
        target = Path(args.dir or "simpar-course").resolve()
        try:
            copied = copy_course(root, target)
        except OSError as exc:
            raise SimparError(f"--dir: cannot copy the lessons into {str(target)!r}: {exc.strerror}") from None
        print(f"lessons and assignments in {target} ({copied} new file(s) copied)")
        folder = target / "lessons"
    if args.copy_only:
        print(f"lessons: {folder}")
        return 0
    if importlib.util.find_spec("jupyterlab") is None:
        raise SimparError(f"lessons: JupyterLab is not installed; {INSTALL_HINT}")
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}"]
    if args.no_browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI machines often run as root,
        command.append("--allow-root")                  # which JupyterLab refuses unless told
    if args.port is not None:
        from simpar import units

        command.append(f"--port={units.positive_int(args.port, '--port')}")
    print(f"opening {folder} in JupyterLab (Ctrl-C stops it)", flush=True)
    os.execv(sys.executable, command)  # JupyterLab takes over this process: its signals, its exit status
    return 0
