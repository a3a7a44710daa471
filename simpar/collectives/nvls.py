"""NVLink SHARP (NVLS) all-reduce, as NCCL runs it on H100 NVSwitch nodes.

The NVSwitch itself reduces: each GPU hands the switch its whole buffer, the switch sums each
1/N slice over the GPUs and returns it to the slice's owner (multimem load-reduce), and each owner
sends its reduced slice back to be multicast to every GPU. Per GPU that is S + S/N bytes each way,
on its own NVLink, all at once: T = S (1 + 1/N) / B, so busbw = 2 (N-1) / (N+1) x B, well above a
ring's (N-1)/N x ... bound. The switch's reduction rate, not the links, is what limits it
(costs/nccl.py NVLS_EFFICIENCY).
"""

from __future__ import annotations

from simpar.collectives.schedule import Phase, Transfer, chunk_sizes
from simpar.errors import SimparError
from simpar.topologies.graph import Topology


def all_reduce(group: list[str], nbytes: int, topology: Topology) -> list[Phase]:
    if not topology.nvls:
        raise SimparError(f"--algo nvls: topology {topology.name} has no NVLink SHARP switches (dgx-h100 has)")
    machines = {topology.machine(g) for g in group}
    if len(machines) != 1:
        raise SimparError("--algo nvls: NVLS reduces inside one NVSwitch node; the group spans "
                          f"{len(machines)} nodes (use ring or hierarchical)")
    switch = next(n for n, d in topology.graph.nodes(data=True)
                  if d["kind"] == "nvswitch" and d["machine"] in machines)
    n = len(group)
    slices = chunk_sizes(nbytes, n)
    up = tuple(Transfer(g, switch, nbytes + slices[i]) for i, g in enumerate(group))
    down = tuple(Transfer(switch, g, slices[i] + nbytes) for i, g in enumerate(group))
    return [Phase("nvls reduce + multicast", up + down)] if n > 1 else []
