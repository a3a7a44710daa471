"""Topology presets, each a cluster (topologies/cluster.py) written in code. Bandwidths are per direction, from datasheets (PCIe: 0.985 GB/s per lane
per direction at Gen3, doubling each generation; NVLink 2/3/4: 25 GB/s per link per direction;
InfiniBand HDR 200 Gb/s, NDR 400 Gb/s). Latencies are per hop and rough; calibrate for real ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from simpar import devices
from simpar.errors import SimparError
from simpar.topologies.cluster_file import is_cluster_file, load, parse
from simpar.topologies.graph import Topology

IB_HOP = 0.6e-6
DGX_NODE_GPUS = 8
NODES_PER_LEAF = 16  # DGX nodes under one leaf switch of the fabric


def _rate(bytes_per_s: float) -> str | float:
    """A rate as the file writes it ("300GB/s"), or the bare number where that would round it."""
    text = f"{bytes_per_s / 1e9:g}"
    return f"{text}GB/s" if "e" not in text and float(text + "e9") == bytes_per_s else bytes_per_s


def _seconds(seconds: float) -> str | float:
    text = f"{seconds * 1e6:g}"
    return f"{text}us" if "e" not in text and float(text + "e-6") == seconds else seconds


def uniform_ring(gpus: int, bandwidth: float, latency: float, device: str = "a100-80gb") -> dict:
    """A ring network: each GPU wired to its two neighbours; traffic to others is relayed around."""
    return {"name": "ring", "description": f"{gpus} GPUs in a ring, {bandwidth / 1e9:g} GB/s and "
                                           f"{latency * 1e6:g} us per link",
            "nodes": 1, "gpus_per_node": gpus, "gpu": device, "nccl": False,
            "intra_node": {"fabric": "wire-ring", "bandwidth": _rate(bandwidth), "latency": _seconds(latency),
                           "efficiency": 1.0}}


def star(gpus: int, bandwidth: float, latency: float, device: str = "a100-80gb") -> dict:
    """Worker-Server's home: N worker machines and one parameter server on one switch."""
    return {"name": "star", "description": f"{gpus} workers and 1 server on a switch, {bandwidth / 1e9:g} GB/s links",
            "nodes": gpus, "gpus_per_node": 1, "gpu": device, "nccl": False,
            "nics": {"per_node": 1, "bandwidth": _rate(bandwidth), "latency": _seconds(latency), "attach": "gpu",
                     "kind": "eth", "efficiency": 1.0},
            "network": {"topology": "single-switch", "server": "epyc-7742x2"}}


def pcie_tree(gpus: int, device: str = "a100-40gb", gpus_per_switch: int = 4, gen: int = 4) -> dict:
    """One server: GPUs under PCIe switches under the CPU root complex, host DRAM beside it.

    GPUs on one switch share its x16 uplink: traffic between switches, and every offload copy,
    crosses it.
    """
    return {"name": "pcie", "description": f"{gpus} GPUs, {gpus_per_switch} per PCIe Gen{gen} switch, one root complex",
            "nodes": 1, "gpus_per_node": gpus, "gpu": device, "host": "epyc-7742x2", "nvme": "nvme-gen4",
            "pcie": {"gen": gen, "gpus_per_switch": gpus_per_switch}}


def workstation(gpus: int, device: str = "rtx-3090") -> dict:
    """Consumer GPUs in x16 slots straight off the CPU. GeForce cards have no PCIe peer-to-peer,
    so GPU-to-GPU traffic turns around in the root complex."""
    return {"name": "workstation", "description": f"{gpus}x {device} on PCIe Gen4 x16 slots, no peer-to-peer",
            "nodes": 1, "gpus_per_node": gpus, "gpu": device, "host": "threadripper-3970x", "nvme": "nvme-gen4",
            "pcie": {"gen": 4, "gpus_per_switch": 0, "p2p": False}}


def nvlink_ring(gpus: int, device: str = "v100-32gb") -> dict:
    """GPUs bridged to their ring neighbours by 2 NVLink-2 links (50 GB/s per direction); other
    pairs talk over PCIe Gen3, since a GPU does not forward NVLink traffic."""
    cluster = pcie_tree(gpus, device, gpus_per_switch=4, gen=3)
    return {**cluster, "name": "nvlink-ring",
            "description": f"{gpus} GPUs, NVLink bridges to ring neighbours (50 GB/s), PCIe Gen3 otherwise",
            "intra_node": {"fabric": "nvlink-ring", "bandwidth": "50GB/s", "latency": "0.5us",
                           "efficiency": "nvlink3"}}


def nvlink_full(gpus: int, device: str = "a100-40gb") -> dict:
    """Every pair of GPUs joined directly; each GPU's 12 NVLink-3 links (300 GB/s per direction)
    are split evenly among its peers, as on a 4-GPU HGX A100 board (100 GB/s per pair)."""
    cluster = pcie_tree(gpus, device, gpus_per_switch=4, gen=4)
    return {**cluster, "name": "nvlink-full",
            "description": f"{gpus} GPUs, all pairs on NVLink ({300 / max(gpus - 1, 1):g} GB/s per pair), "
                           "PCIe Gen4 to host",
            "intra_node": {"fabric": "nvlink-mesh", "bandwidth": "300GB/s", "latency": "0.5us",
                           "efficiency": "nvlink3"}}


_DGX = {  # GPU, host, NVSwitch port per GPU, PCIe gen, NIC, NVLink and InfiniBand link classes, NVLS
    "dgx-a100": ("a100-80gb", "epyc-7742x2", "300GB/s", 4, "200Gb/s", "nvlink3", "ib-hdr", False),  # 8x HDR
    "dgx-h100": ("h100-sxm", "xeon-8480x2", "450GB/s", 5, "400Gb/s", "nvlink4", "ib-ndr", True),  # 8x NDR
    "dgx-h200": ("h200", "xeon-8480x2", "450GB/s", 5, "400Gb/s", "nvlink4", "ib-ndr", True),  # DGX H200: as H100
    "dgx-b200": ("b200", "xeon-8570x2", "900GB/s", 5, "400Gb/s", "nvlink5", "ib-ndr", True),  # 8x CX-7 NDR
}


def dgx_cluster(gpus: int, model: str, device: str | None = None) -> dict:
    """NVSwitch nodes of 8 GPUs; beyond one node, each GPU's own NIC joins an InfiniBand fabric.

    Inside a node, the NVSwitches are one non-blocking switch. Each PCIe switch holds 2 GPUs and
    their 2 NICs. The fabric is a non-blocking two-level fat tree: nodes under leaf switches of
    16 nodes, leaves joined through a core whose uplinks carry everything their leaf can send.
    """
    gpu, host, nvswitch, gen, nic, nvlink, ib, nvls = _DGX[model]
    if gpus > DGX_NODE_GPUS and gpus % DGX_NODE_GPUS:
        raise SimparError(f"--gpus: {model} is built from nodes of {DGX_NODE_GPUS} GPUs; "
                          f"{gpus} is not a multiple of {DGX_NODE_GPUS}")
    nodes, gpu = max(1, gpus // DGX_NODE_GPUS), device or gpu
    return {"name": model, "description": f"{nodes} node(s) x {min(gpus, DGX_NODE_GPUS)} {gpu}, NVSwitch inside, "
                                          f"{nic[:-4]} Gb/s InfiniBand NIC per GPU between nodes",
            "nodes": nodes, "gpus_per_node": DGX_NODE_GPUS, "gpu": gpu, "host": host, "nvme": "nvme-raid-dgx",
            "pcie": {"gen": gen, "gpus_per_switch": 2},
            "intra_node": {"fabric": "nvswitch", "bandwidth": nvswitch, "latency": "0.5us", "efficiency": nvlink,
                           "sharp": nvls},
            "nics": {"per_node": DGX_NODE_GPUS, "bandwidth": nic, "latency": _seconds(IB_HOP), "attach": "pcie-switch",
                     "kind": "ib", "efficiency": ib},
            "network": {"topology": "fat-tree", "nodes_per_leaf": NODES_PER_LEAF, "oversubscription": 1,
                        "latency": _seconds(IB_HOP)}}


@dataclass(frozen=True)
class TopologyPreset:
    name: str
    description: str
    max_gpus: int
    cluster: Callable[..., dict]  # (gpus, [bandwidth, latency,] device=...) -> the cluster file's contents
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
        TopologyPreset("dgx-h200", "nodes of 8 H200 on NVSwitch (NVLink 4), NDR InfiniBand between nodes",
                       16384, lambda gpus, **kw: dgx_cluster(gpus, "dgx-h200", **kw)),
        TopologyPreset("dgx-b200", "nodes of 8 B200 on NVSwitch (NVLink 5), NDR InfiniBand between nodes",
                       16384, lambda gpus, **kw: dgx_cluster(gpus, "dgx-b200", **kw)),
    ]
}


def preset_cluster(name: str, gpus: int, bandwidth: float | None = None, latency: float | None = None,
                   device: str | None = None) -> dict:
    """A preset for ``gpus`` GPUs as a cluster file's contents, with clear errors for anything it cannot hold."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise SimparError(f"--topology: unknown preset {name!r}; choose from {', '.join(PRESETS)} "
                          "(or give a cluster file: --cluster my.yaml)")
    preset = PRESETS[key]
    if gpus < 1:
        raise SimparError(f"--gpus: must be at least 1, got {gpus}")
    if gpus > preset.max_gpus:
        raise SimparError(f"--gpus: topology {key} holds at most {preset.max_gpus} GPUs, asked for {gpus}")
    kw = {} if device is None else {"device": devices.gpu(device).name}
    if not preset.takes_link:
        for flag, value in (("--bandwidth", bandwidth), ("--latency", latency)):
            if value is not None:
                raise SimparError(f"{flag}: only the ring and star topologies take it; "
                                  f"{key} has fixed links")
        return preset.cluster(gpus, **kw)
    return preset.cluster(gpus, bandwidth if bandwidth is not None else preset.default_bandwidth,
                          latency if latency is not None else preset.default_latency, **kw)


def build(name: str, gpus: int, bandwidth: float | None = None, latency: float | None = None,
          device: str | None = None) -> Topology:
    """The topology for ``gpus`` GPUs: a preset by name, or a cluster file by path (--cluster).
    ``device`` swaps the GPU (a preset name: simpar devices)."""
    if is_cluster_file(name):
        for flag, value in (("--bandwidth", bandwidth), ("--latency", latency)):
            if value is not None:
                raise SimparError(f"{flag}: a cluster file gives its links' bandwidths and latencies; leave {flag} out")
        cluster = load(name)
        if device is not None:
            cluster = dataclasses.replace(cluster, gpu=devices.gpu(device))
        return cluster.build(gpus)
    return parse(preset_cluster(name, gpus, bandwidth, latency, device), f"preset {name.strip().lower()}",
                 name.strip().lower()).build(gpus)


def node_size(name: str, gpus: int) -> int:
    """GPUs one node of ``gpus`` holds on a preset or cluster file (every one of them on anything else, such as
    the executor's cpu-host): what hybrid sharding's shard spans by default."""
    if is_cluster_file(name):
        return min(gpus, load(name).gpus_per_node)
    if name.strip().lower() in PRESETS:
        return min(gpus, preset_cluster(name, gpus)["gpus_per_node"])
    return gpus
