"""Topology presets. Bandwidths are per direction, from datasheets (PCIe: 0.985 GB/s per lane
per direction at Gen3, doubling each generation; NVLink 2/3/4: 25 GB/s per link per direction;
InfiniBand HDR 200 Gb/s, NDR 400 Gb/s). Latencies are per hop and rough; calibrate for real ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from simpar import devices
from simpar.costs.nccl import LINK_EFFICIENCY
from simpar.errors import SimparError
from simpar.topologies.graph import Link, Topology

PCIE_X16 = {3: 15.75e9, 4: 31.5e9, 5: 63e9}
PCIE_HOP = 0.5e-6
NVLINK_HOP = 0.5e-6
IB_HOP = 0.6e-6
MEMBUS_HOP = 0.1e-6
PCIE_EFF = LINK_EFFICIENCY["pcie"]
DGX_NODE_GPUS = 8
NODES_PER_LEAF = 16  # DGX nodes under one leaf switch of the fabric


def _attach_host(topo: Topology, machine: int, prefix: str, host_name: str, pcie_gen: int,
                 nvme_name: str = "nvme-gen4") -> str:
    """A root complex with host DRAM and an NVMe drive below it; returns the root's name."""
    host = devices.host(host_name)
    drive = devices.nvme(nvme_name)
    root = topo.add_node(f"{prefix}cpu", "root", machine)
    topo.add_node(f"{prefix}host", "host", machine, host)
    topo.connect(f"{prefix}host", root, Link("membus", host.memory_bandwidth, MEMBUS_HOP))
    topo.add_node(f"{prefix}nvme", "nvme", machine, drive)
    # Reading the drive flows nvme->root; writing flows root->nvme.
    topo.connect(f"{prefix}nvme", root,
                 Link("pcie", min(drive.read_bandwidth, PCIE_X16[pcie_gen] / 4), PCIE_HOP,
                      reverse_bandwidth=min(drive.write_bandwidth, PCIE_X16[pcie_gen] / 4)))
    return root


def uniform_ring(gpus: int, bandwidth: float, latency: float, device: str = "a100-80gb") -> Topology:
    """A ring network: each GPU wired to its two neighbours; traffic to others is relayed around."""
    topo = Topology("ring", f"{gpus} GPUs in a ring, {bandwidth / 1e9:g} GB/s and {latency * 1e6:g} us per link",
                    gpus_forward=True)
    spec = devices.gpu(device)
    for i in range(gpus):
        topo.add_node(f"gpu{i}", "gpu", spec=spec)
    for i in range(gpus if gpus > 2 else gpus - 1):
        topo.connect(f"gpu{i}", f"gpu{(i + 1) % gpus}", Link("wire", bandwidth, latency))
    return topo


def star(gpus: int, bandwidth: float, latency: float, device: str = "a100-80gb") -> Topology:
    """Worker-Server's home: N worker machines and one parameter server on one switch."""
    topo = Topology("star", f"{gpus} workers and 1 server on a switch, {bandwidth / 1e9:g} GB/s links")
    spec = devices.gpu(device)
    topo.add_node("switch", "eth-switch", machine=None)
    topo.add_node("server", "server", machine=gpus, spec=devices.host("epyc-7742x2"))
    topo.connect("server", "switch", Link("eth", bandwidth, latency))
    for i in range(gpus):
        topo.add_node(f"gpu{i}", "gpu", machine=i, spec=spec)
        topo.connect(f"gpu{i}", "switch", Link("eth", bandwidth, latency))
    return topo


def pcie_tree(gpus: int, device: str = "a100-40gb", gpus_per_switch: int = 4, gen: int = 4,
              name: str = "pcie") -> Topology:
    """One server: GPUs under PCIe switches under the CPU root complex, host DRAM beside it.

    GPUs on one switch share its x16 uplink: traffic between switches, and every offload copy,
    crosses it.
    """
    topo = Topology(name, f"{gpus} GPUs, {gpus_per_switch} per PCIe Gen{gen} switch, one root complex", nccl=True)
    spec = devices.gpu(device)
    root = _attach_host(topo, 0, "", "epyc-7742x2", gen)
    for s in range((gpus + gpus_per_switch - 1) // gpus_per_switch):
        switch = topo.add_node(f"pcie-sw{s}", "pcie-switch")
        topo.connect(switch, root, Link("pcie", PCIE_X16[gen], PCIE_HOP, efficiency=PCIE_EFF))
        for i in range(s * gpus_per_switch, min(gpus, (s + 1) * gpus_per_switch)):
            topo.add_node(f"gpu{i}", "gpu", spec=spec)
            topo.connect(f"gpu{i}", switch, Link("pcie", PCIE_X16[gen], PCIE_HOP, efficiency=PCIE_EFF))
    return topo


def workstation(gpus: int, device: str = "rtx-3090") -> Topology:
    """Consumer GPUs in x16 slots straight off the CPU. GeForce cards have no PCIe peer-to-peer,
    so GPU-to-GPU traffic turns around in the root complex."""
    topo = Topology("workstation", f"{gpus}x {device} on PCIe Gen4 x16 slots, no peer-to-peer", nccl=True)
    spec = devices.gpu(device)
    root = _attach_host(topo, 0, "", "threadripper-3970x", 4)
    for i in range(gpus):
        topo.add_node(f"gpu{i}", "gpu", spec=spec)
        topo.connect(f"gpu{i}", root, Link("pcie", PCIE_X16[4], PCIE_HOP, efficiency=PCIE_EFF))
    return topo


def nvlink_ring(gpus: int, device: str = "v100-32gb") -> Topology:
    """GPUs bridged to their ring neighbours by 2 NVLink-2 links (50 GB/s per direction); other
    pairs talk over PCIe Gen3, since a GPU does not forward NVLink traffic."""
    topo = pcie_tree(gpus, device, gpus_per_switch=4, gen=3, name="nvlink-ring")
    topo.description = f"{gpus} GPUs, NVLink bridges to ring neighbours (50 GB/s), PCIe Gen3 otherwise"
    for i in range(gpus if gpus > 2 else gpus - 1):
        topo.connect(f"gpu{i}", f"gpu{(i + 1) % gpus}", Link("nvlink", 2 * 25e9, NVLINK_HOP,
                                                                  efficiency=LINK_EFFICIENCY["nvlink3"]))
    return topo


def nvlink_full(gpus: int, device: str = "a100-40gb") -> Topology:
    """Every pair of GPUs joined directly; each GPU's 12 NVLink-3 links (300 GB/s per direction)
    are split evenly among its peers, as on a 4-GPU HGX A100 board (100 GB/s per pair)."""
    topo = pcie_tree(gpus, device, gpus_per_switch=4, gen=4, name="nvlink-full")
    per_pair = 300e9 / max(gpus - 1, 1)
    topo.description = f"{gpus} GPUs, all pairs on NVLink ({per_pair / 1e9:g} GB/s per pair), PCIe Gen4 to host"
    for i in range(gpus):
        for j in range(i + 1, gpus):
            topo.connect(f"gpu{i}", f"gpu{j}", Link("nvlink", per_pair, NVLINK_HOP,
                                                        efficiency=LINK_EFFICIENCY["nvlink3"]))
    return topo


@dataclass(frozen=True)
class _DGX:
    device: str
    host: str
    nvswitch_bw: float  # per GPU per direction
    pcie_gen: int
    nic_bw: float  # per NIC per direction
    nvlink: str  # link class (costs/nccl.py LINK_EFFICIENCY)
    ib: str
    nvls: bool  # NVSwitch reduces in the switch (NVLink SHARP)


_DGX_MODELS = {
    "dgx-a100": _DGX("a100-80gb", "epyc-7742x2", 300e9, 4, 25e9, "nvlink3", "ib-hdr", False),  # 8x HDR 200 Gb/s
    "dgx-h100": _DGX("h100-sxm", "xeon-8480x2", 450e9, 5, 50e9, "nvlink4", "ib-ndr", True),  # 8x NDR 400 Gb/s
}


def dgx_cluster(gpus: int, model: str) -> Topology:
    """NVSwitch nodes of 8 GPUs; beyond one node, each GPU's own NIC joins an InfiniBand fabric.

    Inside a node, the NVSwitches are one non-blocking switch. Each PCIe switch holds 2 GPUs and
    their 2 NICs. The fabric is a non-blocking two-level fat tree: nodes under leaf switches of
    16 nodes, leaves joined through a core whose uplinks carry everything their leaf can send.
    """
    m = _DGX_MODELS[model]
    if gpus > DGX_NODE_GPUS and gpus % DGX_NODE_GPUS:
        raise SimparError(f"--gpus: {model} is built from nodes of {DGX_NODE_GPUS} GPUs; "
                          f"{gpus} is not a multiple of {DGX_NODE_GPUS}")
    nodes = max(1, gpus // DGX_NODE_GPUS)
    per_node = min(gpus, DGX_NODE_GPUS)
    topo = Topology(model, f"{nodes} node(s) x {per_node} {m.device}, NVSwitch inside, "
                           f"{m.nic_bw * 8 / 1e9:g} Gb/s InfiniBand NIC per GPU between nodes", nccl=True,
                    nvls=m.nvls)
    ib_eff, nvlink_eff = LINK_EFFICIENCY[m.ib], LINK_EFFICIENCY[m.nvlink]
    spec = devices.gpu(m.device)
    leaves = (nodes + NODES_PER_LEAF - 1) // NODES_PER_LEAF
    if nodes > 1:
        topo.add_node("ib-core", "ib-switch", machine=None)
        for leaf in range(leaves):
            topo.add_node(f"ib-leaf{leaf}", "ib-switch", machine=None)
            under = min(NODES_PER_LEAF, nodes - leaf * NODES_PER_LEAF)
            if leaves > 1:
                topo.connect(f"ib-leaf{leaf}", "ib-core",
                             Link("ib", under * per_node * m.nic_bw, IB_HOP, efficiency=ib_eff))
    for node in range(nodes):
        p = f"n{node}."
        root = _attach_host(topo, node, p, m.host, m.pcie_gen, "nvme-raid-dgx")
        nvswitch = topo.add_node(f"{p}nvswitch", "nvswitch", node)
        for s in range((per_node + 1) // 2):
            topo.add_node(f"{p}pcie-sw{s}", "pcie-switch", node)
            topo.connect(f"{p}pcie-sw{s}", root, Link("pcie", PCIE_X16[m.pcie_gen], PCIE_HOP, efficiency=PCIE_EFF))
        for i in range(per_node):
            gpu = topo.add_node(f"{p}gpu{i}", "gpu", node, spec)
            topo.connect(gpu, nvswitch, Link("nvlink", m.nvswitch_bw, NVLINK_HOP, efficiency=nvlink_eff))
            topo.connect(gpu, f"{p}pcie-sw{i // 2}", Link("pcie", PCIE_X16[m.pcie_gen], PCIE_HOP, efficiency=PCIE_EFF))
            if nodes > 1:
                nic = topo.add_node(f"{p}nic{i}", "nic", node, affinity=gpu)
                topo.connect(nic, f"{p}pcie-sw{i // 2}", Link("pcie", PCIE_X16[m.pcie_gen], PCIE_HOP,
                                                               efficiency=PCIE_EFF))
                topo.connect(nic, f"ib-leaf{node // NODES_PER_LEAF}", Link("ib", m.nic_bw, IB_HOP, efficiency=ib_eff))
    return topo


@dataclass(frozen=True)
class TopologyPreset:
    name: str
    description: str
    max_gpus: int
    build: Callable[..., Topology]
    takes_link: bool = False  # whether --bandwidth / --latency apply
    default_bandwidth: float = 0.0
    default_latency: float = 0.0


PRESETS: dict[str, TopologyPreset] = {
    p.name: p
    for p in [
        TopologyPreset("ring", "uniform ring; link bandwidth and latency from --bandwidth/--latency",
                       65536, uniform_ring, True, 100e9, 5e-6),
        TopologyPreset("star", "N workers + 1 dedicated server on one switch (Worker-Server)",
                       4096, star, True, 12.5e9, 5e-6),
        TopologyPreset("pcie", "one server, GPUs under PCIe Gen4 switches, host DRAM at the root",
                       16, pcie_tree),
        TopologyPreset("workstation", "up to 4 RTX-3090 on PCIe Gen4 x16, no peer-to-peer",
                       4, workstation),
        TopologyPreset("nvlink-ring", "V100s bridged in an NVLink ring, PCIe Gen3 otherwise",
                       8, nvlink_ring),
        TopologyPreset("nvlink-full", "all GPU pairs on NVLink (HGX A100 4-GPU style)",
                       8, nvlink_full),
        TopologyPreset("dgx-a100", "nodes of 8 A100-80GB on NVSwitch, HDR InfiniBand between nodes",
                       16384, lambda gpus, **kw: dgx_cluster(gpus, "dgx-a100", **kw)),
        TopologyPreset("dgx-h100", "nodes of 8 H100-SXM on NVSwitch, NDR InfiniBand between nodes",
                       16384, lambda gpus, **kw: dgx_cluster(gpus, "dgx-h100", **kw)),
    ]
}


def build(name: str, gpus: int, bandwidth: float | None = None, latency: float | None = None) -> Topology:
    """Build a preset for ``gpus`` GPUs, with clear errors for anything it cannot hold."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise SimparError(f"--topology: unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    preset = PRESETS[key]
    if gpus < 1:
        raise SimparError(f"--gpus: must be at least 1, got {gpus}")
    if gpus > preset.max_gpus:
        raise SimparError(f"--gpus: topology {key} holds at most {preset.max_gpus} GPUs, asked for {gpus}")
    if not preset.takes_link:
        for flag, value in (("--bandwidth", bandwidth), ("--latency", latency)):
            if value is not None:
                raise SimparError(f"{flag}: only the ring and star topologies take it; "
                                  f"{key} has fixed links")
        return preset.build(gpus)
    return preset.build(gpus,
                        bandwidth if bandwidth is not None else preset.default_bandwidth,
                        latency if latency is not None else preset.default_latency)
