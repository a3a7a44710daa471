"""Worker-Server (parameter server): every worker pushes to one server, which reduces and sends
back. The server's link carries N times what a worker's does, which is why rings replaced it.

The server is the topology's dedicated server node when it has one (``star``); otherwise the
group's first rank plays server for the others (as ``nn.DataParallel`` uses GPU 0).
"""

from __future__ import annotations

from simpar.collectives.schedule import Phase, Transfer, chunk_sizes


def _server_and_workers(group: list[str], server: str | None) -> tuple[str, list[str]]:
    if server is not None:
        return server, list(group)
    return group[0], list(group[1:])


def _push_pull(name, group, server, push_bytes, pull_bytes) -> list[Phase]:
    """push_bytes(i) goes from rank i to the server, then pull_bytes(i) comes back."""
    srv, workers = _server_and_workers(group, server)
    index = {rank: i for i, rank in enumerate(group)}
    push = tuple(Transfer(w, srv, push_bytes(index[w])) for w in workers)
    pull = tuple(Transfer(srv, w, pull_bytes(index[w])) for w in workers)
    return [Phase(f"worker-server {name} push", push), Phase(f"worker-server {name} pull", pull)]


def all_reduce(group, nbytes, server=None):
    return _push_pull("all-reduce", group, server, lambda i: nbytes, lambda i: nbytes)


def reduce_scatter(group, nbytes, server=None):
    chunks = chunk_sizes(nbytes, len(group))
    return _push_pull("reduce-scatter", group, server, lambda i: nbytes, lambda i: chunks[i])


def all_gather(group, nbytes, server=None):
    """Each worker pushes its chunk and pulls the chunks it lacks."""
    chunks = chunk_sizes(nbytes, len(group))
    return _push_pull("all-gather", group, server, lambda i: chunks[i], lambda i: nbytes - chunks[i])


def broadcast(group, nbytes, root=0, server=None):
    """The root hands the data to the server (if separate), which sends it to every other rank."""
    srv = server if server is not None else group[root]
    phases = [Phase("worker-server broadcast push", (Transfer(group[root], srv, nbytes),))] if srv != group[root] else []
    return phases + [Phase("worker-server broadcast pull", tuple(
        Transfer(srv, r, nbytes) for i, r in enumerate(group) if i != root and r != srv))]


def reduce(group, nbytes, root=0, server=None):
    srv = server if server is not None else group[root]
    phases = [Phase("worker-server reduce push", tuple(
        Transfer(r, srv, nbytes) for r in group if r != srv))]
    if srv != group[root]:
        phases.append(Phase("worker-server reduce pull", (Transfer(srv, group[root], nbytes),)))
    return phases
