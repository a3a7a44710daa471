"""ZeRO stage 3: parameters, gradients and optimizer states all split across the data-parallel
group. Module by module (DeepSpeed, the default for zero3): zero3_modules.py. Layer by layer
(``--gather-granularity layer``, FSDP's usual wrapping, and the offload variants): each unit's
parameters are all-gathered just before its forward and again before its
backward (``prefetch`` units ahead, so the gather hides behind compute), dropped after use, and
its gradients are reduce-scattered straight after its backward. Per rank per micro-batch that is
3Φ elements of traffic against DDP's 2Φ.

With tied embeddings the output head reuses the embedding's gathered weights, so that buffer is
kept from the embedding's forward until the head's backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from simpar.plan import Collective, Grid, Plan, Program
from simpar.scenario import Scenario
from simpar.strategies import zero3_modules
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
    n = spec.dp
    prog = Program(tuple(range(n)), name="all ranks")
    phi = work.params(range(work.num_units))
    # offload: gradient shards go to the host
    grads = 0 if hooks.after_reduce else work.g * phi / n
    work.static(prog, work.w * phi / n, grads, work.k * phi / n,
                optimizer_memory=optimizer_memory, params_memory=params_memory)
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
    return Plan(spec.name, Grid(dp=n), [prog])


class _Gatherer:
    """Issues the all-gathers of one pass in ``order``, at most ``prefetch`` units ahead: the
    gather of the j-th unit waits until the (j - prefetch - 1)-th has computed (its buffer is free)."""

    def __init__(self, prog, work, scenario, order, mb, hooks):
        self.prog, self.work, self.order, self.mb, self.hooks = prog, work, order, mb, hooks
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
            self.gathers.append(self.prog.add(Collective, "comm", [free_slot, fetched], op="allgather", group="dp",
                                              nbytes=nbytes, algo=self.algo, payload="params", units=(unit,),
                                              itemsize=self.work.w))
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
    gatherer = _Gatherer(prog, work, scenario, order, mb, hooks)
    last = []
    for i, unit in enumerate(order):
        nbytes = work.w * work.units[unit].params
        prog.alloc("compute", "buffers", nbytes, payload=f"grad unit{unit}")
        gatherer.computed.append(work.backward(prog, unit, mb, [gatherer.ready(i)]))
        prog.free("compute", "buffers", nbytes, payload=f"params unit{unit}", units=(unit,))
        if scenario.model.tied_embeddings and unit == work.num_units - 1:
            prog.free("compute", "buffers", work.w * work.units[0].params, payload="params unit0 (tied head)",
                      units=(0,))
        reduce = prog.add(Collective, "comm", [gatherer.computed[-1]], op="reducescatter", group="dp",
                          nbytes=nbytes, algo=scenario.strategy.algo or "ring", payload="grads", units=(unit,),
                          itemsize=work.w)
        prog.free("comm", "buffers", nbytes, payload=f"grad unit{unit}")
        last.append(hooks.after_reduce(prog, work, reduce, (unit,), mb) if hooks.after_reduce else reduce)
    return last
