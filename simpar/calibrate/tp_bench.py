"""What a tensor-parallel piece of a layer costs beyond its share of the layer: the executor's own
``TensorParallelModel`` on one rank, its all-reduces completed locally.

Why: the simulator prices a piece of a layer (tensor parallelism's attention or MLP half, forward or
backward) as its share of the layer's calibrated overhead, by kernels, plus its FLOPs. The executor's
pieces do Python of their own that the whole layer does not: a leaf and a closure per piece, the work that
completes the piece after its all-reduce (residual adds; backward, a norm's backward through its own
``autograd.backward`` call), twice per layer per phase where the one-rank layer the overheads are fitted on
runs once. In the executor's 2-rank tp step (tiny-deep, 2026-11-26) that came to 14.6 ms a step outside its
ring calls against 11.0 priced. Timed here on one rank (a tp=2 shard: the same shapes a rank computes), it is
set against the simulator's price for the same pieces, and the difference per piece is the profile's
``tp_piece``, forward and backward (``fit_tp_pieces``).

The vocabulary-parallel embedding and head do Python of their own too, all in their continuations: the
embedding adds its positions to the summed partial; the head's cross-entropy takes the maxima's
all-reduce, then exponentials and the sums' all-reduce, then the loss (and ``float`` of it); its backward
runs the norm's backward after its all-reduce. Timed the same way, each is kept apart
(``embedding_fwd``, ``head_fwd``, ``head_bwd``, ``embedding_bwd``): with the executor counting a
continuation with the piece it completes, the one-rank unit's overhead priced tp's embedding and head
forward 30-50 % short (2026-11-27).
"""

from __future__ import annotations

import statistics
import time

PHASES = ("fwd", "bwd")
TP = 2  # the shard timed: a piece at tp=2 (at more ranks a piece is smaller, its Python the same)


def step_pieces(shard, ids, targets):
    """Each piece of one step of a ``TensorParallelModel`` shard (micro-batch 0), in the executor's order, as
    (phase, unit, piece): ``piece()`` computes it and returns its pending reduction, which the caller completes
    before asking for the next (a unit's input, or its output's gradient, is the previous piece's result).
    Zeroes the gradients after the last."""
    inputs, outputs = {}, {}
    for unit in range(len(shard.units)):
        x = ids if unit == 0 else outputs[(unit - 1, 0)].detach().requires_grad_()
        inputs[unit] = x
        for half in range(shard.pieces(unit)):
            yield "fwd", unit, lambda unit=unit, half=half, x=x: shard.forward_piece(unit, 0, half, x, targets, 1.0,
                                                                                    outputs)
    for unit in reversed(range(len(shard.units))):
        grad = inputs[unit + 1].grad if unit + 1 < len(shard.units) else None
        for half in range(shard.pieces(unit)):
            yield "bwd", unit, lambda unit=unit, half=half, grad=grad: shard.backward_piece(unit, 0, half, grad)
    shard.zero_grad(set_to_none=True)


def tp_piece_worker(ctx, models: list[str], batches: list[int], repeats: int) -> list[dict]:
    """Per model and micro-batch: {"model", "batch", "fwd": [s], "bwd": [s], "embedding_fwd": s, "head_fwd": s,
    "head_bwd": s, "embedding_bwd": s}: the mean seconds of each layer piece (attention, then MLP forward; MLP,
    then attention backward) and of the embedding's and head's, the work completing each after its
    all-reduces included, over ``repeats`` steps after two warm-up steps of the whole model's pieces."""
    from simpar.models import model
    from simpar.real.model import build_model, synthetic_batch
    from simpar.real.tensor_parallel import TensorParallelModel

    def complete(reduction):  # the all-reduce's continuations, on the local partial (the same shapes)
        while reduction is not None:
            reduction = reduction.then(reduction.tensor.clone())

    rows = []
    for name in models:
        spec = model(name)
        shard = TensorParallelModel(build_model(spec), 0, TP)
        last = len(shard.units) - 1
        layers = range(1, last)
        ends = {0: "embedding", last: "head"}
        for b in batches:
            ids, targets = synthetic_batch(spec, b, 0)
            timed = {"fwd": [], "bwd": [], **{f"{kind}_{phase}": [] for kind in ends.values() for phase in PHASES}}
            for step in range(repeats + 2):
                for phase, unit, piece in step_pieces(shard, ids, targets):
                    start = time.perf_counter()
                    complete(piece())
                    if step >= 2:
                        timed[phase if unit in layers else f"{ends[unit]}_{phase}"].append(time.perf_counter() - start)
            per_step = 2 * len(layers)
            rows.append({"model": name, "batch": b,
                         **{phase: [statistics.fmean(timed[phase][i::per_step]) for i in range(per_step)]
                            for phase in PHASES},
                         **{key: statistics.fmean(seconds) for key, seconds in timed.items() if key not in PHASES}})
    return rows


def fit_tp_pieces(rows: list[dict], profile, precision: str) -> dict[str, float]:
    """{"fwd": s, "bwd": s, "embedding_fwd": s, ...}: per layer piece, the mean over every timed piece of its
    measured seconds less what the simulator prices it at on ``profile`` (a tp=2 plan of the row's model and
    micro-batch, the piece's compute alone: no resume, no work between ops, as timed); per embedding and
    head phase, the same over the rows, their cold caches priced in; never below 0. Rows of a calibration
    before the embedding and head were timed give the layers' alone."""
    from simpar.models import model
    from simpar.plan import Compute
    from simpar.scenario import make_scenario
    from simpar.sim.op_costs import OpCosts
    from simpar.strategies import build_plan

    extra: dict[str, list[float]] = {}
    for row in rows:
        scenario = make_scenario(model(row["model"]), "tp", TP, micro_batch=row["batch"], precision=precision,
                                 topology="cpu-host")
        plan = build_plan(scenario)
        prog = plan.programs[0]
        costs = OpCosts(plan, scenario, profile.topology(TP, precision))
        for phase in PHASES:
            computes = [op for op in prog.ops if isinstance(op, Compute) and op.phase == phase]
            pieces = [op for op in computes if op.part]
            priced = [costs.compute_time(prog, op) for op in pieces]
            extra.setdefault(phase, []).extend(measured - price for measured, price in zip(row[phase], priced))
            for op in computes:
                key = f"{scenario.model.unit_kind(op.unit)}_{phase}"
                if not op.part and key in row:  # the embedding's and the head's, whole, with the cold caches it
                    # finds here as in a step (the model's other units ran since): priced apart (``unit_cold``)
                    price = costs.compute_time(prog, op) + costs.cold.get((0, op.id), 0.0)
                    extra.setdefault(key, []).append(row[key] - price)
    return {key: max(statistics.fmean(values), 0.0) for key, values in extra.items() if values}
