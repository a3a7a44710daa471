"""Simulate one collective on a topology and report it the way nccl-tests would."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import simpy

from simpar.collectives import BUSBW_FACTOR, collective, expand, normalize, protocol_for
from simpar.engine import Network
from simpar.topologies.graph import Topology


@dataclass
class CollectiveResult:
    op: str
    algo: str
    topology: str
    gpus: int
    bytes: int
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    ranks: list[dict]
    links: list[dict]
    server: dict | None = None
    protocol: str | None = None  # NCCL's protocol on GPU topologies (None: plain alpha-beta)
    timeline: list[dict] = field(default_factory=list)

    def to_json(self, timeline: bool = False) -> dict:
        data = asdict(self)
        if not timeline:
            data.pop("timeline")
        if data["server"] is None:
            data.pop("server")
        return data


def simulate_collective(topology: Topology, op: str, algo: str | None, nbytes: int,
                        root: int = 0, peer: int = -1) -> CollectiveResult:
    """One collective over every GPU of ``topology``, rank i on the i-th GPU."""
    op, algo = normalize(op, algo)
    group = list(topology.gpus)
    phases = expand(op, algo, topology, group, nbytes, root, peer)
    env = simpy.Environment()
    network = Network(env, topology)
    proto = protocol_for(topology, algo, phases)
    collective(network, phases, proto=proto, algo=algo)
    env.run()
    elapsed = float(env.now)
    n = len(group)
    algbw = nbytes / elapsed if elapsed > 0 else 0.0
    ranks = [{"rank": i, "bytes_sent": network.sent.get(g, 0), "bytes_received": network.received.get(g, 0)}
             for i, g in enumerate(group)]
    server = None
    if algo == "ps" and topology.server is not None:
        server = {"bytes_sent": network.sent.get(topology.server, 0),
                  "bytes_received": network.received.get(topology.server, 0)}
    links = [{"name": name, "kind": kind, "bytes": b} for name, kind, b in network.busiest_channels()]
    timeline = [{"tag": r.tag, "src": r.src, "dst": r.dst, "bytes": r.nbytes, "steps": r.steps,
                 "start_s": float(r.start), "end_s": float(r.end)} for r in network.timeline]
    return CollectiveResult(op, algo, topology.name, n, int(nbytes), elapsed, algbw,
                            algbw * BUSBW_FACTOR[op](n), ranks, links, server,
                            proto.name if proto else None, timeline)
