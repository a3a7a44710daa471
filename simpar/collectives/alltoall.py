"""All-to-all: every rank sends a different chunk of its buffer to every other rank (MoE dispatch and
combine, Ulysses). ``nbytes`` is one rank's whole send buffer S, chunk j (S/n) for rank j; a rank keeps
its own chunk, so it sends and receives (n - 1)/n x S.

pairwise: in step k rank i sends its chunk to rank i + k and receives from rank i - k. NCCL posts every
peer's send and receive in one group (ncclGroupStart/End), so on NCCL topologies the n - 1 steps run at
once, sharing the links (NVLink and the NIC busy together); elsewhere (gloo, simpar's executor) they run
one after another, as n - 1 phases.

hierarchical (two hops, as DeepSpeed-MoE's and Tutel's): inside each node, local rank l sends local
rank l' the chunks bound for every node's local rank l' (aggregation), then local rank l' sends each
other node's l' the chunks gathered for it, one message of L chunks. The bytes crossing the network
are the same (M - 1)/M x S per rank for M nodes; the messages across it fall from n - L to M - 1.
"""

from __future__ import annotations

from simpar.collectives.hierarchical import _machines
from simpar.collectives.schedule import Phase, Transfer, chunk_sizes, drop_empty


def pairwise(group: list[str], nbytes: int, concurrent: bool = False) -> list[Phase]:
    n = len(group)
    chunks = chunk_sizes(nbytes, n)
    steps = [Phase(f"all-to-all step {k}", tuple(Transfer(group[i], group[(i + k) % n], chunks[(i + k) % n])
                                                 for i in range(n) if chunks[(i + k) % n]))
             for k in range(1, n)]
    if concurrent:
        return drop_empty([Phase("all-to-all", tuple(t for step in steps for t in step.transfers))])
    return drop_empty(steps)


def hierarchical(group: list[str], nbytes: int, topology) -> list[Phase]:
    machines = _machines(group, topology)
    per_node, nodes = len(machines[0]), len(machines)
    chunk = nbytes // len(group)
    intra = [Transfer(m[l], m[(l + k) % per_node], chunk * nodes)
             for k in range(1, per_node) for m in machines for l in range(per_node)]
    inter = [Transfer(machines[a][l], machines[(a + k) % nodes][l], chunk * per_node)
             for k in range(1, nodes) for a in range(nodes) for l in range(per_node)]
    return drop_empty([Phase("intra all-to-all", tuple(intra)), Phase("inter all-to-all", tuple(inter))])
