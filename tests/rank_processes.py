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


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def ranks_of(pid: int) -> set[int]:
    """The rank processes multiprocessing started below ``pid``: spawned, or forked by its fork server
    (not the server itself, nor the resource tracker)."""
    below = descendants(pid)
    servers = {child for child in below if b"forkserver" in _cmdline(child) and _parent(child) == pid}
    return {child for child in below if b"spawn_main" in _cmdline(child) or _parent(child) in servers}


def started_by(pid: int) -> set[int]:
    """Every process multiprocessing started below ``pid``: the ranks and the fork server they came from."""
    return ranks_of(pid) | {child for child in descendants(pid) if b"forkserver" in _cmdline(child)}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
