"""Worker-Server data parallelism (a parameter server): after the whole backward, every worker
pushes its gradients to one server and pulls the averaged gradients back, then steps locally.

No buckets and no overlap, as in classic parameter-server training: the server's link carries
N times a worker's traffic, which is the lesson. The server is the topology's dedicated server
node when it has one (``star``), else rank 0 (as ``nn.DataParallel`` uses GPU 0).
"""

from __future__ import annotations

from simpar.errors import SimparError
from simpar.plan import Plan
from simpar.scenario import Scenario
from simpar.strategies import ddp


def build(scenario: Scenario) -> Plan:
    if scenario.strategy.algo not in (None, "ps"):
        raise SimparError(f"--algo: strategy dp is Worker-Server (ps); for {scenario.strategy.algo} "
                          "use --strategy ddp")
    plan = ddp.build(scenario, algo="ps", bucket_bytes=2**62, name="dp")
    plan.notes.append("dp: gradients go to the server after the whole backward (one bucket, no overlap)")
    return plan
