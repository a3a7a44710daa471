"""Collectives as NCCL runs them: an achieved fraction of each link class's wire bandwidth, and per
call a base latency plus a latency per algorithm step that depends on the protocol.

NCCL (src/graph/tuning.cc, v2.12-2.18) prices a ring collective as
    base_latency[protocol] + steps_on_nvlink x hw_latency[nvlink][protocol]
                           + steps_on_network x hw_latency[net][protocol] + bytes / bandwidth[protocol]
and picks, per call, the protocol that is fastest for the message: LL (8-byte lines, half of them
flags: half the bandwidth, lowest latency), LL128 (120 of every 128 bytes are data) or Simple (full
bandwidth, highest latency). A ring all-reduce over N ranks has 2(N-1) steps, a reduce-scatter or
all-gather N-1: so latency grows with N, which is what makes ZeRO-3's gathers over hundreds of ranks
expensive. Those latencies (microseconds) are NCCL's own table. LL's and LL128's share of the wire
is charged by sending more bytes over it (its flags), not by counting more payload.

The achieved fraction of wire bandwidth per link class is measured (nccl-tests, large messages),
each from one published figure named beside it; topology builders attach it to their links.
"""

from __future__ import annotations

from dataclasses import dataclass

# Achieved fraction of the datasheet per-direction bandwidth, per link class.
LINK_EFFICIENCY = {
    # nccl-tests all_reduce_perf, 8x A100-SXM4-80GB on NVSwitch, 1 GB: 231 GB/s busbw of 300 GB/s
    "nvlink3": 231 / 300,
    # nccl-tests all_reduce_perf, 8x H100-SXM5 on NVSwitch, ring algorithm: ~370 GB/s of 450 GB/s
    "nvlink4": 370 / 450,
    # NVLink 5 (B200, GB200: 900 GB/s a direction): no published nccl-tests figure at hand: NVLink 4's fraction
    "nvlink5": 370 / 450,
    # nccl-tests, 2 DGX A100 nodes, 8x HDR 200 Gb/s each, 4 GB (latency < 0.5 %): 188 GB/s of 200
    "ib-hdr": 188 / 200,
    "ib-ndr": 188 / 200,  # no published NDR figure at hand: HDR's fraction (same NICs' generation rules)
    # PCIe: 256-byte TLP payloads carry 24 bytes of header and framing (256 / 280 = 0.914), on top of
    # the 128b/130b encoding already in the x16 figure
    "pcie": 256 / 280,
}
# NVLink SHARP (NVLS): the NVSwitch reduces and multicasts; its throughput limit (not the links')
# sets the pace. nccl-tests, 8x H100 NVLS all-reduce, 8 GB: 479 GB/s busbw, i.e. each GPU's
# S (1 + 1/N) bytes each way at 479 / (2 (N-1) / (N+1)) = 308 GB/s of NVLink4's 450.
NVLS_EFFICIENCY = 479 / (2 * 7 / 9) / 450  # N = 8: busbw / (2 (N-1) / (N+1)) / wire rate

# tuning.cc: base latency (us) of the ring algorithm per protocol, and per-step hardware latency
# (us) per link class; LL128 and LL use 120/128 and 1/2 of the bandwidth.
BASE_LATENCY_US = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
HW_LATENCY_US = {
    "nvlink": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
    "pci": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
    "net": {"LL": 2.7, "LL128": 4.0, "Simple": 9.6},
}
WIRE_FRACTION = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
NVLS_LATENCY_US = 23.0  # tuning.cc: NVLS, Simple, NVLink


def latency_class(link_kinds) -> str:
    """The hardware class of a route: the network if it leaves the machine, else PCIe, else NVLink."""
    kinds = set(link_kinds)
    if kinds & {"ib", "eth"}:
        return "net"
    if "pcie" in kinds:
        return "pci"
    return "nvlink"


@dataclass(frozen=True)
class Protocol:
    name: str
    base_latency: float  # seconds, once per call
    step_latency: dict  # latency class -> seconds per step
    wire_fraction: float  # of the link's bandwidth the payload gets


def protocol(name: str) -> Protocol:
    return Protocol(name, BASE_LATENCY_US[name] * 1e-6,
                    {cls: table[name] * 1e-6 for cls, table in HW_LATENCY_US.items()}, WIRE_FRACTION[name])


PROTOCOLS = tuple(protocol(name) for name in WIRE_FRACTION)  # LL, LL128, Simple: collectives.protocol_for picks


# the links already run at nvlink4's fraction: NVLS gets the rest of its lower rate by a wire fraction
NVLS = Protocol("Simple", 0.0, dict.fromkeys(HW_LATENCY_US, NVLS_LATENCY_US * 1e-6),
                NVLS_EFFICIENCY / LINK_EFFICIENCY["nvlink4"])
