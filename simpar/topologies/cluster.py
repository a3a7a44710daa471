"""A cluster as data, and the one builder that turns it into a Topology.

Every topology simpar knows is a ``Cluster``: the presets (topologies/builders.py) are clusters
written in code, and ``--cluster my.yaml`` reads one from a file (topologies/cluster_file.py). A
cluster is ``nodes`` boxes of ``gpus_per_node`` GPUs, each box with a PCIe tree under its CPU
root complex (host DRAM and an NVMe drive beside it), an optional GPU fabric inside the box
(NVSwitch, an NVLink mesh or ring, or plain wires), NICs, and a network joining the boxes
(one switch, a fat tree with oversubscribed uplinks, or rail-optimized).
"""

from __future__ import annotations

from dataclasses import dataclass

from simpar.costs.nccl import LINK_EFFICIENCY
from simpar.devices.specs import GPUSpec, HostSpec, NVMeSpec
from simpar.errors import SimparError
from simpar.topologies.graph import Link, Topology

PCIE_X16 = {3: 15.75e9, 4: 31.5e9, 5: 63e9, 6: 126e9}  # bytes/s per direction: 0.985 GB/s per lane at Gen3,
PCIE_EFF = LINK_EFFICIENCY["pcie"]                      # doubling each generation
MEMBUS_HOP = 0.1e-6
PCIE_HOP = 0.5e-6
FABRICS = ("pcie", "nvswitch", "nvlink-mesh", "nvlink-ring", "wire-ring")
NIC_ATTACH = ("pcie-switch", "root", "gpu")
NETWORKS = ("single-switch", "fat-tree", "rail-optimized")


@dataclass(frozen=True)
class Pcie:
    gen: int = 4
    gpus_per_switch: int = 0  # 0: GPUs in slots straight off the root complex
    p2p: bool = True  # False: GPU-to-GPU traffic turns around in the root complex


@dataclass(frozen=True)
class IntraNode:
    """How the GPUs of one box reach each other besides PCIe. ``bandwidth`` per direction: per GPU
    (nvswitch: its port; nvlink-mesh: split evenly among its peers) or per neighbour (rings)."""

    fabric: str = "pcie"
    bandwidth: float = 0.0
    latency: float = 0.5e-6
    efficiency: float = 1.0
    sharp: bool = False  # the NVSwitch reduces in the switch (NVLink SHARP / NVLS)


@dataclass(frozen=True)
class Nics:
    per_node: int
    bandwidth: float  # bytes/s per direction, per NIC
    latency: float
    attach: str = "pcie-switch"  # GPUDirect beside the GPUs, behind the CPU ("root"), or the GPU's own port
    kind: str = "ib"  # link kind: ib or eth (collectives/costs look at it)
    efficiency: float = 1.0


@dataclass(frozen=True)
class Network:
    topology: str = "fat-tree"
    nodes_per_leaf: int = 16  # boxes under one leaf (or one rail switch's pod)
    oversubscription: float = 1.0  # leaf downlink : uplink bandwidth
    latency: float = 0.6e-6  # per switch-to-switch hop
    server: HostSpec | None = None  # a dedicated Worker-Server parameter server on the network


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: int
    gpus_per_node: int
    gpu: GPUSpec
    description: str = ""
    host: HostSpec | None = None
    nvme: NVMeSpec | None = None
    pcie: Pcie | None = None
    intra_node: IntraNode = IntraNode()
    nics: Nics | None = None
    network: Network = Network()
    nccl: bool = True  # GPUs talking through NCCL (its protocol latencies); False: a textbook alpha-beta net

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def build(self, gpus: int | None = None) -> Topology:
        """The topology for ``gpus`` GPUs (default: all): whole boxes, or part of one box."""
        gpus = self.gpus if gpus is None else gpus
        if gpus < 1:
            raise SimparError(f"--gpus: must be at least 1, got {gpus}")
        if gpus > self.gpus:
            raise SimparError(f"--gpus: cluster {self.name} has {self.nodes} node(s) x {self.gpus_per_node} GPUs "
                              f"= {self.gpus}; asked for {gpus}")
        if gpus > self.gpus_per_node and gpus % self.gpus_per_node:
            raise SimparError(f"--gpus: cluster {self.name} is built from nodes of {self.gpus_per_node} GPUs; "
                              f"{gpus} is not a multiple of {self.gpus_per_node}")
        return _Builder(self, gpus).topology


class _Builder:
    def __init__(self, cluster: Cluster, gpus: int):
        c = self.c = cluster
        self.nodes = max(1, gpus // c.gpus_per_node)
        self.per_node = min(gpus, c.gpus_per_node)
        self.topology = Topology(c.name, c.description, gpus_forward=c.intra_node.fabric == "wire-ring",
                                 nccl=c.nccl, nvls=c.intra_node.sharp)
        networked = c.nics is not None and (self.nodes > 1 or c.network.server is not None)
        self.nics = c.nics if networked else None
        self.leaves = self._fabric() if self.nics else []
        for node in range(self.nodes):
            self._node(node)

    def name(self, node: int, part: str) -> str:
        return f"n{node}.{part}" if self.nodes > 1 else part

    # -- the network between boxes -----------------------------------------------------------
    def _switch_link(self, bandwidth: float) -> Link:
        return Link(self.nics.kind, bandwidth, self.c.network.latency, efficiency=self.nics.efficiency)

    def _fabric(self) -> list[list[str]]:
        """Build the switches; return, per node, the switch each of its NICs plugs into."""
        topo, net, nics = self.topology, self.c.network, self.nics
        kind = f"{nics.kind}-switch"
        nic_count = min(nics.per_node, self.per_node) if nics.attach != "gpu" else self.per_node
        if net.topology == "single-switch":
            topo.add_node(f"{nics.kind}-switch", kind, machine=None)
            leaves = [[f"{nics.kind}-switch"] * nic_count for _ in range(self.nodes)]
        else:
            pods = -(-self.nodes // net.nodes_per_leaf)
            rails = net.topology == "rail-optimized"
            per_pod = nic_count if rails else 1  # switches per pod: one per rail, or one leaf
            top = f"{nics.kind}-spine" if rails else f"{nics.kind}-core"
            if pods * per_pod > 1:
                topo.add_node(top, kind, machine=None)
            for pod in range(pods):
                under = min(net.nodes_per_leaf, self.nodes - pod * net.nodes_per_leaf)
                for s in range(per_pod):
                    name = f"{nics.kind}-leaf{pod}" if not rails else (
                        f"{nics.kind}-rail{s}" if pods == 1 else f"{nics.kind}-pod{pod}-rail{s}")
                    topo.add_node(name, kind, machine=None)
                    if pods * per_pod > 1:  # uplink: what the switch's NICs can send, over the oversubscription
                        ports = under * (1 if rails else nic_count)
                        topo.connect(name, top, self._switch_link(ports * nics.bandwidth / net.oversubscription))
            leaves = []
            for node in range(self.nodes):
                pod = node // net.nodes_per_leaf
                leaves.append([(f"{nics.kind}-rail{k}" if pods == 1 else f"{nics.kind}-pod{pod}-rail{k}") if rails
                               else f"{nics.kind}-leaf{pod}" for k in range(nic_count)])
        if net.server is not None:
            topo.add_node("server", "server", machine=self.nodes, spec=net.server)
            topo.connect("server", leaves[0][0], Link(nics.kind, nics.bandwidth, nics.latency,
                                                      efficiency=nics.efficiency))
        return leaves

    # -- one box ---------------------------------------------------------------------------------
    def _pcie_link(self, lanes_fraction: float = 1.0) -> Link:
        return Link("pcie", PCIE_X16[self.c.pcie.gen] * lanes_fraction, PCIE_HOP, efficiency=PCIE_EFF)

    def _node(self, node: int) -> None:
        c, topo, n = self.c, self.topology, self.name
        root = None
        if c.pcie is not None:
            root = topo.add_node(n(node, "cpu"), "root", node)
            if c.host is not None:
                topo.add_node(n(node, "host"), "host", node, c.host)
                topo.connect(n(node, "host"), root, Link("membus", c.host.memory_bandwidth, MEMBUS_HOP))
            if c.nvme is not None:  # reading the drive flows nvme->root; writing flows root->nvme (x4 slot)
                x4 = PCIE_X16[c.pcie.gen] / 4
                topo.add_node(n(node, "nvme"), "nvme", node, c.nvme)
                topo.connect(n(node, "nvme"), root, Link("pcie", min(c.nvme.read_bandwidth, x4), PCIE_HOP,
                                                         reverse_bandwidth=min(c.nvme.write_bandwidth, x4)))
        intra = c.intra_node
        if intra.fabric == "nvswitch":
            topo.add_node(n(node, "nvswitch"), "nvswitch", node)
        per_switch = c.pcie.gpus_per_switch if c.pcie is not None else 0
        if per_switch:
            for s in range(-(-self.per_node // per_switch)):
                topo.add_node(n(node, f"pcie-sw{s}"), "pcie-switch", node)
                topo.connect(n(node, f"pcie-sw{s}"), root, self._pcie_link())
        gpus = [n(node, f"gpu{i}") for i in range(self.per_node)]
        nic_of = self._nic_groups()
        for i, gpu in enumerate(gpus):
            topo.add_node(gpu, "gpu", node, c.gpu)
            if intra.fabric == "nvswitch":
                topo.connect(gpu, n(node, "nvswitch"), self._intra_link(intra.bandwidth))
            if c.pcie is not None:
                topo.connect(gpu, n(node, f"pcie-sw{i // per_switch}") if per_switch else root, self._pcie_link())
            if self.nics and (self.nics.attach == "gpu" or nic_of[i][0] == i):
                self._nic(node, i, gpus, nic_of)
        if intra.fabric == "nvlink-mesh":
            for i in range(self.per_node):
                for j in range(i + 1, self.per_node):
                    topo.connect(gpus[i], gpus[j], self._intra_link(intra.bandwidth / max(self.per_node - 1, 1)))
        elif intra.fabric in ("nvlink-ring", "wire-ring"):
            count = self.per_node if self.per_node > 2 else self.per_node - 1
            for i in range(count):
                topo.connect(gpus[i], gpus[(i + 1) % self.per_node], self._intra_link(intra.bandwidth))

    def _intra_link(self, bandwidth: float) -> Link:
        intra = self.c.intra_node
        kind = "wire" if intra.fabric == "wire-ring" else "nvlink"
        return Link(kind, bandwidth, intra.latency, efficiency=intra.efficiency)

    def _nic_groups(self) -> list[tuple[int, ...]]:
        """GPU index -> the GPUs (by index) sharing its NIC, in order."""
        if not self.nics or self.nics.attach == "gpu":
            return [(i,) for i in range(self.per_node)]
        share = max(1, self.per_node // self.nics.per_node)
        return [tuple(range(i // share * share, min(self.per_node, (i // share + 1) * share)))
                for i in range(self.per_node)]

    def _nic(self, node: int, i: int, gpus: list[str], nic_of: list[tuple[int, ...]]) -> None:
        topo, nics, c = self.topology, self.nics, self.c
        group = nic_of[i]
        index = i if nics.attach == "gpu" else group[0] // len(group)
        switch = self.leaves[node][index]
        wire = Link(nics.kind, nics.bandwidth, nics.latency, efficiency=nics.efficiency)
        if nics.attach == "gpu":  # the GPU's own network port
            topo.connect(gpus[i], switch, wire)
            return
        nic = topo.add_node(self.name(node, f"nic{index}"), "nic", node,
                            affinity=frozenset(gpus[g] for g in group))
        per_switch = c.pcie.gpus_per_switch
        beside = self.name(node, f"pcie-sw{i // per_switch}") if per_switch and nics.attach == "pcie-switch" \
            else self.name(node, "cpu")
        topo.connect(nic, beside, self._pcie_link())
        topo.connect(nic, switch, wire)
