"""Hierarchical algorithms: rings inside each machine, rings across machines.

All-reduce = intra-machine reduce-scatter (each of the L local ranks ends with 1/L of the data),
then L concurrent inter-machine all-reduces (local rank j with every machine's local rank j, on
chunk j), then intra-machine all-gather. Only 1/L of the bytes cross the slow network per rank.
"""

from __future__ import annotations

from simpar.collectives import ring
from simpar.collectives.schedule import Phase, chunk_sizes, drop_empty, merge_phases
from simpar.errors import SimparError
from simpar.topologies.graph import Topology


def _machines(group: list[str], topology: Topology) -> list[list[str]]:
    by_machine: dict[int, list[str]] = {}
    for rank in group:
        by_machine.setdefault(topology.machine(rank), []).append(rank)
    machines = list(by_machine.values())
    if len({len(m) for m in machines}) != 1:
        sizes = ", ".join(str(len(m)) for m in machines)
        raise SimparError(f"--algo hierarchical: needs the same number of ranks on every machine, got {sizes}")
    return machines


def _local(machines, nbytes, fn) -> list[Phase]:
    return merge_phases(*(fn(m, nbytes) for m in machines))


def _across(machines, nbytes, fn) -> list[Phase]:
    """One ring per local index j, over chunk j of ``nbytes``."""
    per_machine = len(machines[0])
    chunks = chunk_sizes(nbytes, per_machine)
    return merge_phases(*(fn([m[j] for m in machines], chunks[j]) for j in range(per_machine)))


def _renamed(phases: list[Phase], prefix: str) -> list[Phase]:
    return [Phase(f"{prefix} {p.name}", p.transfers) for p in phases]


def all_reduce(group, nbytes, topology):
    machines = _machines(group, topology)
    return drop_empty(_renamed(_local(machines, nbytes, ring.reduce_scatter), "intra")
                      + _renamed(_across(machines, nbytes, ring.all_reduce), "inter")
                      + _renamed(_local(machines, nbytes, ring.all_gather), "intra"))


def reduce_scatter(group, nbytes, topology):
    machines = _machines(group, topology)
    return drop_empty(_renamed(_local(machines, nbytes, ring.reduce_scatter), "intra")
                      + _renamed(_across(machines, nbytes, ring.reduce_scatter), "inter"))


def all_gather(group, nbytes, topology):
    machines = _machines(group, topology)
    return drop_empty(_renamed(_across(machines, nbytes, ring.all_gather), "inter")
                      + _renamed(_local(machines, nbytes, ring.all_gather), "intra"))
