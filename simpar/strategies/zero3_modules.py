"""ZeRO-3 gathering module by module, as DeepSpeed does (``--gather-granularity module``).

DeepSpeed partitions every parameter and, before each submodule runs, all-gathers the parameters
of that submodule (Q, K, V, O, MLP up/down, each norm...): one collective per module, each paying
its own latency, which over hundreds of ranks is what makes ZeRO-3 slow at scale. After a module
runs, its parameters are released unless the same module runs again within
``max_reuse_distance`` parameters of other modules' use (DeepSpeed's
``stage3_max_reuse_distance``: partitioned_param_coordinator.release_sub_module walks the recorded
module order). With full recomputation a layer's backward runs its modules twice, forward then
backward, so released modules are gathered again for the backward: three gathers of such a module
per micro-batch against two without recomputation.

The trace of module uses decides it: for each use, gather if the module is not held, and release
after it unless its next use is near enough (in parameters, or within the prefetch window). A unit's gathers are issued (``prefetch`` units
ahead) before the unit's compute op, which holds every recomputed and backward use; gradients are
reduce-scattered per unit in one coalesced call of per-module pieces (DeepSpeed's
reduce_scatter_coalesced over parameter partitions), so each module's shard is a
``torch.tensor_split`` chunk of that module alone.
"""

from __future__ import annotations

from simpar.plan import Collective, Copy, Grid, Plan, Program
from simpar.scenario import Scenario
from simpar.strategies.work import Work


def unit_modules(scenario: Scenario, unit: int) -> tuple[tuple[str, int], ...]:
    return scenario.model.unit_modules(scenario.model.unit_kind(unit))


def modules_used(scenario: Scenario, unit: int) -> list[tuple[int, int]]:
    """(unit, module index) of the parameters a unit's forward reads, in order; a tied head also reads
    the embedding's token table."""
    used = [(unit, m) for m in range(len(unit_modules(scenario, unit)))]
    if unit == scenario.model.layers + 1 and scenario.model.tied_embeddings:
        used.append((0, 0))
    return used


def trace(scenario: Scenario) -> list[tuple[tuple[int, str, int], tuple[int, int]]]:
    """Every module use of a step, in order: ((micro-batch, phase, unit), (unit, module))."""
    units = range(scenario.model.layers + 2)
    uses = []
    for mb in range(scenario.microbatches):
        uses += [((mb, "fwd", u), used) for u in units for used in modules_used(scenario, u)]
        for u in reversed(units):
            mods = modules_used(scenario, u)
            recomputed = scenario.strategy.recompute == "full" and 0 < u < scenario.model.layers + 1
            uses += [((mb, "bwd", u), used) for used in (mods + mods[::-1] if recomputed else mods[::-1])]
    return uses


def persistent(scenario: Scenario) -> set[tuple[int, int]]:
    """Modules small enough to stay whole on every rank (DeepSpeed's stage3_param_persistence_threshold,
    applied here to a module's parameters together: DeepSpeed tests each parameter, so a large
    layer's small bias stays gathered there and is gathered with its weight here)."""
    limit = scenario.strategy.param_persistence_threshold
    return {(u, m) for u in range(scenario.model.layers + 2) for m, (_, p) in enumerate(unit_modules(scenario, u))
            if p <= limit}


def gathers_and_releases(scenario: Scenario, uses) -> tuple[list[bool], list[bool]]:
    """Per use: whether it needs an all-gather first, and whether the module is released after it.
    A module is kept when its next use is within ``max_reuse_distance`` parameters, or (DeepSpeed
    skips releasing what the prefetcher already fetched again) in a later op no more than
    ``prefetch`` ops ahead, whose gathers are issued before this one ends; but never beyond
    ``max_live_parameters`` kept at once, and (DeepSpeed) not past the end of a micro-batch's backward.
    Persistent modules start the step whole (gathered after the last step) and are never released:
    DeepSpeed's end-of-backward release skips them (measured: --engine deepspeed)."""
    op_of, ops = [], {}
    for key, _ in uses:
        op_of.append(ops.setdefault(key, len(ops)))
    sizes = {(u, m): p for u in range(scenario.model.layers + 2) for m, (_, p) in enumerate(unit_modules(scenario, u))}
    traversed = [0]  # parameters of the uses before each one
    for _, module in uses:
        traversed.append(traversed[-1] + sizes[module])
    next_use, seen = [None] * len(uses), {}
    for i in reversed(range(len(uses))):
        next_use[i] = seen.get(uses[i][1])
        seen[uses[i][1]] = i
    spec, resident = scenario.strategy, persistent(scenario)
    live_limit = spec.max_live_parameters if spec.max_live_parameters is not None else float("inf")
    held, gather, release, live = set(resident), [], [], 0
    for i, (_, module) in enumerate(uses):
        if module in resident:
            gather.append(False)
            release.append(False)
            continue
        gather.append(module not in held)
        if module not in held:
            held.add(module)
            live += sizes[module]
        j = next_use[i]
        far = j is None or traversed[j] - traversed[i + 1] >= spec.max_reuse_distance
        prefetched = j is not None and op_of[i] < op_of[j] <= op_of[i] + spec.prefetch
        # DeepSpeed releases every gathered (non-persistent) parameter when a backward ends (release_and_reset_all),
        # whatever the reuse distance or prefetch: the next micro-batch gathers again
        boundary = spec.deepspeed_habits and j is not None and uses[j][0][0] != uses[i][0][0]
        release.append((far and not prefetched) or boundary or live > live_limit)
        if release[-1]:
            held.discard(module)
            live -= sizes[module]
    return gather, release


def build(scenario: Scenario, params_memory: str = "gpu", optimizer_memory: str = "gpu", hooks=None) -> Plan:
    """``hooks`` (zero3._Hooks): the offload variant's gradient copies (after_reduce), host state and step;
    with ``params_memory`` host, each module's shard comes up over PCIe before its gather."""
    spec, work = scenario.strategy, Work(scenario)
    n = spec.dp
    prog = Program(tuple(range(n)), name="all ranks")
    phi = work.params(range(work.num_units))
    after_reduce = getattr(hooks, "after_reduce", None)
    work.static(prog, work.w * phi / n, 0 if after_reduce else work.g * phi / n, work.k * phi / n,
                optimizer_memory=optimizer_memory, params_memory=params_memory)
    if getattr(hooks, "host_states", None) is not None:
        hooks.host_states(prog, work, scenario)
    uses = trace(scenario)
    gather, release = gathers_and_releases(scenario, uses)
    resident = sorted(persistent(scenario))
    ops = list(dict.fromkeys(key for key, _ in uses))  # compute ops in order
    per_op = {key: [] for key in ops}
    for (key, module), g, r in zip(uses, gather, release):
        per_op[key].append((module, g, r))
    computed, issued, held_buffers, last = [], [], set(resident), []
    for u, m in resident:  # whole on every rank from the last step's post-step gather
        prog.alloc("compute", "buffers", work.w * unit_modules(scenario, u)[m][1], payload=f"params unit{u} module{m}",
                   units=(u,), modules=(m,))

    def issue(j: int) -> None:  # op j's gathers, once the buffers of op j - prefetch - 1 are free
        free_slot = computed[j - spec.prefetch - 1] if j > spec.prefetch else None
        ids = []
        for (u, m), needs, _ in per_op[ops[j]]:
            if not needs:
                continue
            nbytes = work.w * unit_modules(scenario, u)[m][1]
            if (u, m) not in held_buffers:
                held_buffers.add((u, m))
                prog.alloc("comm", "buffers", nbytes, payload=f"params unit{u} module{m}", deps=[free_slot],
                           units=(u,), modules=(m,))
            fetched = None
            if params_memory == "host":  # offload_param: the module's shard comes up from host memory first
                fetched = prog.add(Copy, "copy", [free_slot], src="host", dst="gpu", nbytes=nbytes // n,
                                   payload=f"params unit{u} module{m}", units=(u,))
            ids.append(prog.add(Collective, "comm", [free_slot, fetched], op="allgather", group="dp", nbytes=nbytes,
                                algo=spec.algo or "ring", payload="params", units=(u,), modules=(m,),
                                itemsize=work.w))
        issued.append(ids)

    for j, (mb, phase, unit) in enumerate(ops):
        while len(issued) <= min(j + spec.prefetch, len(ops) - 1):
            issue(len(issued))
        deps = issued[j]  # (a module kept from an earlier op needs no gather)
        if phase == "fwd":
            computed.append(work.forward(prog, unit, mb, deps))
        else:
            grad_bytes = work.w * work.units[unit].params
            prog.alloc("compute", "buffers", grad_bytes, payload=f"grad unit{unit}")
            computed.append(work.backward(prog, unit, mb, deps))
        for (u, m), _, released in per_op[ops[j]]:
            if released and (u, m) in held_buffers:
                held_buffers.discard((u, m))
                prog.free("compute", "buffers", work.w * unit_modules(scenario, u)[m][1],
                          payload=f"params unit{u} module{m}", units=(u,), modules=(m,))
        if phase == "bwd":
            pieces = tuple(work.w * p for _, p in unit_modules(scenario, unit))
            last.append(prog.add(Collective, "comm", [computed[-1]], op="reducescatter", group="dp",
                                 nbytes=grad_bytes, algo=spec.algo or "ring", payload="grads", units=(unit,),
                                 modules=tuple(range(len(pieces))), pieces=pieces, itemsize=work.w))
            prog.free("comm", "buffers", grad_bytes, payload=f"grad unit{unit}")
            if after_reduce:  # offload: the gradient shards go down to the host
                last[-1] = after_reduce(prog, work, last[-1], (unit,), mb)
    step = hooks.step(prog, work, last) if getattr(hooks, "step", None) else work.gpu_step(prog, phi // n, deps=last)
    if resident:  # the updated persistent parameters, gathered in one coalesced call (stage3's _post_step)
        pieces = tuple(work.w * unit_modules(scenario, u)[m][1] for u, m in resident)  # (into the buffers they
        # never left: persistent modules are not released)
        prog.add(Collective, "comm", [step], op="allgather", group="dp", nbytes=sum(pieces), algo=spec.algo or "ring",
                 payload="persistent params", units=tuple(sorted({u for u, _ in resident})), pieces=pieces,
                 itemsize=work.w)
    return Plan(spec.name, Grid(dp=n), [prog])
