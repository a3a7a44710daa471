"""ZeRO stage 3: parameters, gradients and optimizer states all split across the data-parallel
group. Module by module (DeepSpeed, the default for zero3): zero3_modules.py. Layer by layer
(``--gather-granularity layer``, FSDP's usual wrapping, and the offload variants): each unit's
parameters are all-gathered just before its forward and again before its
backward (``prefetch`` units ahead, so the gather hides behind compute), dropped after use, and
its gradients are reduce-scattered straight after its backward. Per rank per micro-batch that is
3Φ elements of traffic against DDP's 2Φ.

With tied embeddings the output head reuses the embedding's gathered weights, so that buffer is
kept from the embedding's forward until the head's backward.

ZeRO++ (Wang et al. 2023) changes three of these collectives: qwZ gathers int8 weights (half of the
16-bit bytes, plus a scale per block: strategies/quantize.py), in forward, and in backward too unless
hpZ is on; hpZ keeps a secondary partition of the 16-bit weights over the ``zeropp_hpz`` ranks of a
node after each forward gather, so backward gathers from it inside the node (and holds Φ·w/hpZ more
per rank); qgZ reduce-scatters int4 gradients (a quarter of the 16-bit bytes) hierarchically, inside
the node first. Hybrid sharding (hsdp, PyTorch's HYBRID_SHARD) shards over the "shard" group (a node)
and replicates across: gathers and reduce-scatters inside it, then an all-reduce of each unit's
gradient shard over the "replica" group (the ranks holding the same shard, one a node).
"""

from __future__ import annotations

from dataclasses import dataclass

from simpar.plan import Collective, Grid, Plan, Program
from simpar.scenario import Scenario
from simpar.strategies import zero3_modules
from simpar.strategies.quantize import collective_bytes
from simpar.strategies.work import Work


@dataclass
class _Hooks:
    """How the offload variants move shards to and from the host or NVMe; each returns the op
    that later ones should wait for."""

    before_gather: object = None  # (prog, work, unit, mb, deps) -> op
    after_reduce: object = None  # (prog, work, reduce_op, units, mb) -> op
    step: object = None  # (prog, work, last_ops) -> op
    host_states: object = None  # (prog, work, scenario): model states the host keeps besides the optimizer


def build(scenario: Scenario, params_memory: str = "gpu", optimizer_memory: str = "gpu", **hooks) -> Plan:
    if scenario.gather_granularity == "module":
        return zero3_modules.build(scenario, params_memory, optimizer_memory, _Hooks(**hooks))
    spec = scenario.strategy
    hooks = _Hooks(**hooks)
    work = Work(scenario)
    shard = sharding(scenario)
    n = shard if spec.name == "hsdp" else spec.dp  # (hpZ's partition is a second copy beside the dp shard)
    prog = Program(tuple(range(spec.dp)), name="all ranks")
    phi = work.params(range(work.num_units))
    # offload: gradient shards go to the host
    grads = 0 if hooks.after_reduce else work.g * phi / n
    work.static(prog, work.w * phi / n, grads, work.k * phi / n,
                optimizer_memory=optimizer_memory, params_memory=params_memory)
    if spec.zeropp_hpz:
        prog.alloc("compute", "params", work.w * phi / spec.zeropp_hpz, payload="secondary partition (hpZ)")
    if hooks.host_states is not None:
        hooks.host_states(prog, work, scenario)
    last = []
    for mb in range(scenario.microbatches):
        _forward(prog, work, scenario, mb, hooks)
        last += _backward(prog, work, scenario, mb, hooks)
    if hooks.step is not None:
        hooks.step(prog, work, last)
    else:
        work.gpu_step(prog, phi // n, deps=last)
    return Plan(spec.name, Grid(dp=spec.dp, shard=shard or 1), [prog])


def sharding(scenario: Scenario) -> int:
    """The ranks a shard spans below the whole dp group: hsdp's shard (a node's GPUs unless --shard-size
    says), ZeRO++'s hpZ partition (group "shard"); 0: none."""
    spec = scenario.strategy
    if spec.name == "hsdp":
        return spec.shard_size or min(spec.dp, scenario.node_gpus)
    return spec.zeropp_hpz


def _gather(scenario: Scenario, work: Work, unit: int, backward: bool) -> dict:
    """Group, bytes and payload of a unit's parameter gather (see the module's note on ZeRO++ and hsdp)."""
    spec, numel = scenario.strategy, work.units[unit].params
    if spec.name == "hsdp" or (backward and spec.zeropp_hpz):
        return {"group": "shard", "nbytes": work.w * numel, "payload": "params", "itemsize": work.w}
    if spec.zeropp_qwz:
        return {"group": "dp", "nbytes": collective_bytes(numel, spec.dp, "int8"), "payload": "params (int8)",
                "itemsize": 1}
    return {"group": "dp", "nbytes": work.w * numel, "payload": "params", "itemsize": work.w}


class _Gatherer:
    """Issues the all-gathers of one pass in ``order``, at most ``prefetch`` units ahead: the
    gather of the j-th unit waits until the (j - prefetch - 1)-th has computed (its buffer is free)."""

    def __init__(self, prog, work, scenario, order, mb, hooks, backward=False):
        self.prog, self.work, self.order, self.mb, self.hooks = prog, work, order, mb, hooks
        self.scenario, self.backward = scenario, backward
        self.prefetch, self.algo = scenario.strategy.prefetch, scenario.strategy.algo or "ring"
        self.gathers: list[int] = []
        self.computed: list[int] = []

    def ready(self, i: int) -> int:
        """The gather op of the i-th unit, issuing it (and those up to the prefetch depth)."""
        while len(self.gathers) <= min(i + self.prefetch, len(self.order) - 1):
            j = len(self.gathers)
            unit = self.order[j]
            nbytes = self.work.w * self.work.units[unit].params
            free_slot = self.computed[j - self.prefetch - 1] if j > self.prefetch else None
            fetched = (self.hooks.before_gather(self.prog, self.work, unit, self.mb, [free_slot])
                       if self.hooks.before_gather else None)
            self.prog.alloc("comm", "buffers", nbytes, payload=f"params unit{unit}", deps=[free_slot], units=(unit,))
            self.gathers.append(self.prog.add(Collective, "comm", [free_slot, fetched], op="allgather",
                                              algo=self.algo, units=(unit,),
                                              **_gather(self.scenario, self.work, unit, self.backward)))
        return self.gathers[i]


def _forward(prog, work, scenario, mb, hooks) -> None:
    order = list(range(work.num_units))
    gatherer = _Gatherer(prog, work, scenario, order, mb, hooks)
    for i, unit in enumerate(order):
        gatherer.computed.append(work.forward(prog, unit, mb, [gatherer.ready(i)]))
        if not (scenario.model.tied_embeddings and unit == 0):
            prog.free("compute", "buffers", work.w * work.units[unit].params, payload=f"params unit{unit}",
                      units=(unit,))


def _backward(prog, work, scenario, mb, hooks) -> list[int]:
    order = list(reversed(range(work.num_units)))
    gatherer = _Gatherer(prog, work, scenario, order, mb, hooks, backward=True)
    last = []
    for i, unit in enumerate(order):
        nbytes = work.w * work.units[unit].params
        prog.alloc("compute", "buffers", nbytes, payload=f"grad unit{unit}")
        gatherer.computed.append(work.backward(prog, unit, mb, [gatherer.ready(i)]))
        prog.free("compute", "buffers", nbytes, payload=f"params unit{unit}", units=(unit,))
        if scenario.model.tied_embeddings and unit == work.num_units - 1:
            prog.free("compute", "buffers", work.w * work.units[0].params, payload="params unit0 (tied head)",
                      units=(0,))
        reduce = _reduce(prog, work, scenario, unit, gatherer.computed[-1])
        prog.free("comm", "buffers", nbytes, payload=f"grad unit{unit}")
        last.append(hooks.after_reduce(prog, work, reduce, (unit,), mb) if hooks.after_reduce else reduce)
    return last


def _reduce(prog, work, scenario, unit, after) -> int:
    """A unit's gradient reduce-scatter: over dp (qgZ: int4, hierarchically); hsdp: inside the shard, then
    the shard all-reduced across the replicas."""
    spec, numel = scenario.strategy, work.units[unit].params
    algo = spec.algo or "ring"
    if spec.zeropp_qgz:
        return prog.add(Collective, "comm", [after], op="reducescatter", group="dp", algo="hierarchical",
                        nbytes=collective_bytes(numel, spec.dp, "int4"), payload="grads (int4)", units=(unit,),
                        itemsize=1)
    group = "shard" if spec.name == "hsdp" else "dp"
    op = prog.add(Collective, "comm", [after], op="reducescatter", group=group, nbytes=work.w * numel, algo=algo,
                  payload="grads", units=(unit,), itemsize=work.w)
    if spec.name == "hsdp" and spec.dp > sharding(scenario):
        n = sharding(scenario)
        op = prog.add(Collective, "comm", [op], op="allreduce", group="replica", nbytes=work.w * -(-numel // n),
                      algo=algo, payload="grads shard", units=(unit,), itemsize=work.w)
    return op
