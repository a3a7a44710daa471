"""Finding a real run's rank processes from /proc (Linux), for tests that stop runs and check none is left."""

from __future__ import annotations

import os


def descendants(pid: int) -> set[int]:
    """Live (not zombie) processes below ``pid``."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def ranks_of(pid: int) -> set[int]:
    """The rank processes multiprocessing spawned below ``pid`` (not its resource tracker)."""
    ranks = set()
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as handle:
                if b"spawn_main" in handle.read():
                    ranks.add(child)
        except OSError:
            continue
    return ranks


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
