"""Finding a real run's rank processes from /proc (Linux), for tests that stop runs and check none is left."""

from __future__ import annotations

import os
import time


def _live_parents() -> dict[int, int]:
    """{pid: parent pid} of every live (not zombie) process."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(pid: int, parents: dict[int, int] | None = None) -> set[int]:
    """Live (not zombie) processes below ``pid``."""
    parents = _live_parents() if parents is None else parents
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


def _server_and_ranks(pid: int) -> tuple[set[int], set[int]]:
    """(fork servers, ranks) multiprocessing started below ``pid``: a rank is spawned, or forked by a
    server (forked ranks carry the server's command line); the resource tracker is neither."""
    parents = _live_parents()
    below = descendants(pid, parents)
    servers = {child for child in below if parents[child] == pid and b"forkserver" in _cmdline(child)}
    ranks = {child for child in below if parents[child] in servers or b"spawn_main" in _cmdline(child)}
    return servers, ranks


def ranks_of(pid: int) -> set[int]:
    """The rank processes multiprocessing started below ``pid``."""
    return _server_and_ranks(pid)[1]


def started_by(pid: int) -> set[int]:
    """The ranks and the fork server they came from."""
    servers, ranks = _server_and_ranks(pid)
    return servers | ranks


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def left_after(pids: set[int], seconds: float = 10.0) -> list[int]:
    """Those of ``pids`` still alive after waiting up to ``seconds`` for them to go (a fork server exits
    a moment after simpar and its ranks)."""
    gone_by = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < gone_by:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]
