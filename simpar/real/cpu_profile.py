"""The CPU machine the executor runs on (gloo, one process per rank) as a topology: ``rank_processes`` builds it
from a calibrated profile's figures (calibrate/profile.py); ``cpu_topology`` from rough built-in ones, for the
lessons, which compare bytes and memory rather than time.

Each rank is a process with its own slice of the machine: when there are more ranks than cores
they share the cores evenly (compute, memory bandwidth and the CPU's Adam all slow down by
cores/ranks); ranks talk through gloo's TCP loopback, modelled as one switch. Every figure here
is an order-of-magnitude guess for a current x86-64 core, not a measurement: expect errors of
several times, above all for tiny models, whose time goes to per-op overheads a roofline does
not see.
"""

from __future__ import annotations

import os

from simpar import devices
from simpar.devices.specs import GPUSpec, HostSpec
from simpar.topologies.graph import Link, Topology

CORE_FP32_FLOPS = 100e9  # AVX2: 2 FMA units x 8 lanes x 2 FLOPs x ~3 GHz
ACHIEVABLE = 0.1  # hidden sizes of 64-128 keep matrix kernels far from peak
CORE_MEMORY_BANDWIDTH = 10e9  # bytes/s one core streams from DRAM
CORE_ADAM_PARAMS_PER_S = 1e8  # torch's CPU Adam (foreach), one core
LOOPBACK_BANDWIDTH = 2e9  # gloo over TCP on localhost, bytes/s per direction per process
LOOPBACK_LATENCY = 50e-6  # per message, through the kernel's TCP stack
MEMCPY_BANDWIDTH = 5e9  # an offload "copy" between two tensors in the same DRAM


def machine_id() -> dict:
    """The machine a profile was measured on: host, CPU, cores and torch version (either changes what a step
    costs)."""
    import platform

    import torch

    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count() or 1, "torch": torch.__version__}


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def rank_processes(world: int, device: GPUSpec, host: HostSpec, step_latency: float, bandwidth: float,
                   copy_rate: float, description: str) -> Topology:
    """``world`` rank processes on one machine: each a "GPU" with its own slice of host memory (a
    machine per rank, so no rank relays another's traffic), all on one loopback switch.

    ``step_latency`` and ``bandwidth`` are a ring step's, as calibrated: each rank sends a message and
    receives one at once. A rank's core does the work of both (it copies what it sends and what it
    receives, and wakes for each), so a rank's link to the switch is half-duplex, at twice
    ``bandwidth``, and a message's latency is work its two ends share with their other messages
    (``Topology.latency_as_work``): a ring step costs ``step_latency`` + bytes / ``bandwidth`` as
    measured, and a one-way message (a Worker-Server leg, a pipeline send) half of each. On the
    development VM, 2 ranks after a barrier: a Worker-Server all-reduce (two one-way legs of the whole
    buffer) cost 0.37 ms (median) at 4 KiB against 1.04 ms for the ring's two steps of half of it, and
    both grew alike with the buffer, 1.0-1.1 ns a byte (to 4.7 and 5.2 ms at 4 MiB)."""
    topo = Topology("cpu-host", description)
    topo.latency_as_work = True
    topo.add_node("loopback", "eth-switch", machine=None)
    for rank in range(world):
        gpu = topo.add_node(f"gpu{rank}", "gpu", machine=rank, spec=device)
        topo.connect(gpu, "loopback", Link("eth", 2 * bandwidth, step_latency / 2, half_duplex=True))
        root = topo.add_node(f"m{rank}-cpu", "root", machine=rank)
        topo.connect(gpu, root, Link("membus", copy_rate, 0.0))
        topo.add_node(f"m{rank}-host", "host", machine=rank, spec=host)
        topo.connect(f"m{rank}-host", root, Link("membus", copy_rate, 0.0))
        topo.add_node(f"m{rank}-nvme", "nvme", machine=rank, spec=devices.nvme("nvme-gen4"))
        topo.connect(f"m{rank}-nvme", root, Link("pcie", copy_rate, 0.0))
    return topo


def cpu_topology(world: int, cores: int | None = None) -> Topology:
    """``world`` rank processes on a machine with ``cores`` cores (default: this machine's)."""
    cores = cores or os.cpu_count() or 1
    share = min(1.0, cores / world)
    ram = _memory_bytes()
    flops = CORE_FP32_FLOPS * share
    rank_device = GPUSpec("cpu-core", flops, None, flops, flops, ACHIEVABLE, ram // world,
                          CORE_MEMORY_BANDWIDTH * share, "simpar's rough CPU profile (a share of one core)")
    host = HostSpec("cpu-host", max(1, round(share)), ram // world, MEMCPY_BANDWIDTH, flops,
                    CORE_ADAM_PARAMS_PER_S * share, "simpar's rough CPU profile")
    return rank_processes(world, rank_device, host, 2 * LOOPBACK_LATENCY, LOOPBACK_BANDWIDTH * share,
                          MEMCPY_BANDWIDTH * share,
                          f"{world} gloo processes on {cores} CPU cores, TCP loopback between them")
