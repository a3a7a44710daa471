"""The executor performs a strategy's Plan for real and trains exactly like one process.

Tolerances: with SGD the only difference is the order of floating-point sums (ring chunks vs one
process), so parameters agree to 1e-6; Adam divides by sqrt(v), which magnifies those last-bit
differences for near-zero gradients, so after 3 steps parameters agree to 1e-4 (losses to 1e-5).
bf16-mixed runs (bf16 weights, gradients and traffic, fp32 masters) are held to the fp32
reference within what bf16's 8-bit mantissa allows: losses to 1e-3, parameters to 1e-2.
"""

import pytest
import torch

from simpar.models import ModelSpec, model
from simpar.real.executor import run_rank, single_process
from simpar.real.launch import launch
from simpar.scenario import make_scenario
from simpar.plan import Collective, Compute, op_class
from simpar.sim import simulate
from simpar.strategies import build_plan

pytestmark = pytest.mark.slow
STEPS = 3


@pytest.mark.parametrize("strategy,world,optimizer,atol", [
    ("dp", 2, "sgd", 1e-6), ("ddp", 2, "sgd", 1e-6), ("ddp", 3, "adam", 1e-4), ("zero1", 2, "sgd", 1e-6),
    ("zero1", 4, "adam", 1e-4), ("zero2", 2, "sgd", 1e-6), ("zero2", 3, "sgd-momentum", 1e-6),
    ("zero3", 2, "sgd", 1e-6), ("zero3", 4, "adam", 1e-4), ("zero2-offload", 2, "adam", 1e-4),
    ("zero3-offload", 2, "sgd", 1e-6), ("zero3-infinity", 2, "adam", 1e-4), ("zero3-infinity", 2, "sgd-momentum", 1e-6),
])
def test_strategy_trains_like_one_process_and_sends_the_simulated_bytes(strategy, world, optimizer, atol):
    scenario = make_scenario(model("tiny"), strategy, world, micro_batch=2, microbatches=2, precision="fp32",
                             optimizer=optimizer, topology="pcie", bucket_bytes=64 * 1024)
    ranks = launch(run_rank, world, (scenario, STEPS, 0), timeout=240)
    reference = single_process(scenario, STEPS, 0)
    _check_training(ranks, reference, atol)
    _check_bytes(scenario, ranks)


def _check_training(ranks, reference, atol, loss_rel=1e-5):
    for rank in ranks:
        assert rank["losses"] == pytest.approx(reference["losses"], rel=loss_rel)
        for unit, params in rank["params"].items():
            assert torch.allclose(params, reference["params"][unit], rtol=0, atol=atol)
    assert set().union(*(r["params"] for r in ranks)) == set(reference["params"])  # every unit checked


def _check_bytes(scenario, ranks):
    """Traffic and model-state memory measured on every rank equal the simulator's, exactly."""
    simulated = simulate(scenario).ranks
    assert [r["bytes_sent"] for r in ranks] == [STEPS * r["bytes_sent"] for r in simulated]
    assert [r["bytes_received"] for r in ranks] == [STEPS * r["bytes_received"] for r in simulated]
    assert [r["offload_bytes"] for r in ranks] == [STEPS * r["offload_bytes"] for r in simulated]
    plan = build_plan(scenario)
    for rank, (real, sim) in enumerate(zip(ranks, simulated)):
        for category in ("params", "grads", "optimizer", "host", "nvme"):
            assert abs(real["memory"][category] - sim["memory"][category]) <= _uneven(plan, rank), (rank, category)
        assert real["memory"]["activations"] > 0  # seen through autograd's saved-tensor hooks
        ops = build_plan(scenario).program_of(rank).ops
        timed = [op for op in ops if op_class(op)]
        ids = [entry["op"] for entry in real["timeline"]]
        assert list(dict.fromkeys(ids)) == [op.id for op in timed]  # each op, in Plan order, ...
        for position, op_id in enumerate(ids):  # ... a compute again only as a TP call's continuation
            if op_id in ids[:position]:
                call = ops[ids[position - 1]]
                assert isinstance(ops[op_id], Compute) and isinstance(call, Collective) and call.group == "tp"


def _uneven(plan, rank) -> int:
    """Shards are torch.tensor_split chunks (of each module alone when ZeRO-3 shards by module), so a
    bucket (module) that does not divide by the group size
    gives its first ranks one element more than the simulator's mean; 0 when all divide."""
    buckets = {(op.units, i, piece // op.itemsize) for op in plan.program_of(rank).ops
               if isinstance(op, Collective) and op.op == "reducescatter"
               for i, piece in enumerate(op.pieces or (op.nbytes,))}
    return sum(16 for *_, numel in buckets if numel % plan.grid.dp)  # one element: weight + K bytes at most


UNTIED = ModelSpec("tiny-untied", layers=4, hidden=64, heads=4, ffn=256, vocab=256, seq=32, positions=32,
                   tied_embeddings=False)


@pytest.mark.parametrize("schedule,world,v,dp", [("gpipe", 2, 1, 1), ("1f1b", 4, 1, 1), ("interleaved", 2, 2, 1),
                                                 ("1f1b", 4, 1, 2)])
def test_pipeline_trains_like_one_process_and_sends_the_simulated_bytes(schedule, world, v, dp):
    scenario = make_scenario(UNTIED, "pp", world, dp=dp, micro_batch=2, microbatches=4, precision="fp32",
                             optimizer="sgd", topology="pcie", schedule=schedule, virtual_stages=v)
    ranks = launch(run_rank, world, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    _check_bytes(scenario, ranks)


@pytest.mark.parametrize("strategy,spec,dp,pp,tp,optimizer,atol", [
    ("tp", model("tiny"), 1, 1, 2, "sgd", 1e-6),  # tied embedding and head: one vocabulary split
    ("tp", model("tiny"), 1, 1, 4, "adam", 1e-4),
    ("3d", model("tiny"), 2, 1, 2, "adam", 1e-4),  # ZeRO-1 across dp, over TP-sliced parameters
    ("3d", UNTIED, 1, 2, 2, "sgd", 1e-6),
])
def test_tensor_parallel_trains_like_one_process_and_sends_the_simulated_bytes(strategy, spec, dp, pp, tp,
                                                                               optimizer, atol):
    """Megatron slicing: the losses use a vocabulary-parallel cross-entropy (a different summation
    than one process's), so they agree to 1e-5; parameters as elsewhere."""
    world = dp * pp * tp
    scenario = make_scenario(spec, strategy, world, dp=dp, pp=pp, tp=tp, micro_batch=2, microbatches=2 * pp,
                             precision="fp32", optimizer=optimizer, topology="pcie")
    ranks = launch(run_rank, world, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), atol)
    _check_bytes(scenario, ranks)


@pytest.mark.parametrize("strategy,spec,dp,pp,tp,optimizer,atol", [
    ("tp", model("tiny"), 1, 1, 2, "sgd", 1e-6),  # learned positions: each rank adds its block's
    ("3d", UNTIED, 1, 2, 2, "sgd", 1e-6),  # sequence blocks sent between stages
    ("3d", model("tiny"), 2, 1, 2, "adam", 1e-4),
])
def test_sequence_parallelism_trains_like_one_process_and_sends_the_simulated_bytes(strategy, spec, dp, pp, tp,
                                                                                    optimizer, atol):
    """Korthikanti et al.: every TP all-reduce performed as a reduce-scatter + all-gather over the
    sequence, the replicated parameters' gradients all-reduced after the backward; the bytes each rank
    sends are the simulator's, and training is one process's."""
    world = dp * pp * tp
    scenario = make_scenario(spec, strategy, world, dp=dp, pp=pp, tp=tp, micro_batch=2, microbatches=2 * pp,
                             precision="fp32", optimizer=optimizer, topology="pcie", sequence_parallel=True)
    ranks = launch(run_rank, world, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), atol)
    _check_bytes(scenario, ranks)


PAUSE_S = 0.02


def _slow_continuations_rank(ctx, scenario, steps):
    """A rank whose every TP continuation (the work completing a piece after its all-reduce) first sleeps
    ``PAUSE_S``: where the executor counts that time shows in its op times."""
    import time

    from simpar.real import tensor_parallel

    made = tensor_parallel.Reduction.__init__

    def slowed(self, tensor, op, then):
        def pause_then(result):
            time.sleep(PAUSE_S)
            return then(result)
        made(self, tensor, op, pause_then)

    tensor_parallel.Reduction.__init__ = slowed
    return run_rank(ctx, scenario, steps, 0)


def test_a_tensor_parallel_continuation_counts_with_the_piece_it_completes_not_the_call():
    """The simulator prices a piece with its continuation (tp_bench.py); the executor times the call apart
    from it, and the continuation as a second stretch of the compute that left the reduction."""
    scenario = make_scenario(model("tiny"), "tp", 2, tp=2, micro_batch=2, precision="fp32", topology="pcie")
    ops = build_plan(scenario).program_of(0).ops
    calls = [op for op in ops if isinstance(op, Collective) and op.group == "tp"]
    for rank in launch(_slow_continuations_rank, 2, (scenario, 2), timeout=240):
        by_class: dict = {}
        for op_id, seconds in rank["op_means"].items():
            by_class[op_class(ops[int(op_id)])] = by_class.get(op_class(ops[int(op_id)]), 0.0) + seconds
        assert by_class["collectives"] < len(calls) * PAUSE_S / 2  # no call holds a pause
        assert by_class["forward"] + by_class["backward"] > len(calls) * PAUSE_S
        timeline = rank["timeline"]
        for call, after in zip(timeline, timeline[1:]):
            if ops[call["op"]] in calls:  # the continuation starts where the call ends, as a forward or backward op
                assert after["start"] == call["end"] and after["class"] in ("forward", "backward")
                assert after["end"] - after["start"] >= PAUSE_S


@pytest.mark.parametrize("spec,kw", [
    (model("tiny"), {}),  # tied: the head gathers the embedding's token table again
    (UNTIED, {"recompute": "full"}),  # recomputation gathers every module again
    (UNTIED, {"recompute": "full", "max_reuse_distance": 20_000, "microbatches": 2}),  # some modules kept
    (model("tiny"), {"gather_granularity": "layer", "recompute": "full"}),
])
def test_zero3_by_module_trains_like_one_process_and_sends_the_simulated_bytes(spec, kw):
    """DeepSpeed's granularity: one all-gather per module (each module sharded alone), gradients
    reduce-scattered per unit in one coalesced call; bytes equal the simulator's."""
    options = {"microbatches": 1, **kw}
    scenario = make_scenario(spec, "zero3", 3, micro_batch=2, precision="fp32", optimizer="sgd",
                             topology="pcie", **options)
    ranks = launch(run_rank, 3, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    _check_bytes(scenario, ranks)


@pytest.mark.parametrize("granularity", ["module", "layer"])
def test_zero3_on_one_rank_holds_everything(granularity):
    """One rank: the shard is the whole, gathers move nothing and nothing is released (found on a GPU
    machine with one GPU)."""
    scenario = make_scenario(model("tiny"), "zero3", 1, micro_batch=2, precision="fp32", optimizer="sgd",
                             topology="pcie", gather_granularity=granularity)
    ranks = launch(run_rank, 1, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    _check_bytes(scenario, ranks)


def test_full_recomputation_trains_like_one_process_and_keeps_fewer_activations():
    kw = dict(micro_batch=2, microbatches=2, precision="fp32", optimizer="sgd", topology="pcie")
    plain = launch(run_rank, 2, (make_scenario(UNTIED, "zero3", 2, **kw), 1, 0), timeout=240)
    scenario = make_scenario(UNTIED, "zero3", 2, recompute="full", **kw)
    ranks = launch(run_rank, 2, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    _check_bytes(scenario, ranks)
    assert ranks[0]["memory"]["activations"] < plain[0]["memory"]["activations"] / 2


@pytest.mark.parametrize("strategy,world,kw", [("zero3", 3, {}), ("3d", 4, {"dp": 2, "tp": 2})])
def test_native_collectives_train_alike_and_are_not_counted_as_the_algorithms_traffic(strategy, world, kw):
    """--collectives native: gloo's own all-reduce / all-gather (reduce-scatter through an all-reduce,
    uneven all-gathers padded); traffic is the backend's, so it is reported as not measured."""
    scenario = make_scenario(model("tiny"), strategy, world, micro_batch=2, microbatches=2, precision="fp32",
                             optimizer="sgd", topology="pcie", **kw)
    ranks = launch(run_rank, world, (scenario, STEPS, 0, "native"), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    assert all(r["bytes_sent"] is None and r["bytes_received"] is None for r in ranks)


@pytest.mark.parametrize("strategy,spec", [("ddp", model("tiny")), ("zero2", model("tiny")),
                                           ("zero3-offload", model("tiny")), ("tp", model("tiny")), ("pp", UNTIED)])
def test_bf16_mixed_precision_trains_alike_with_exactly_the_simulated_bytes(strategy, spec):
    """Weights, gradients and traffic in bf16 (2 bytes), fp32 master weights in the optimizer (K = 12)."""
    scenario = make_scenario(spec, strategy, 2, micro_batch=2, microbatches=4 if strategy == "pp" else 2,
                             precision="bf16-mixed", optimizer="adam", topology="pcie")
    ranks = launch(run_rank, 2, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-2, loss_rel=1e-3)
    _check_bytes(scenario, ranks)


@pytest.mark.parametrize("schedule,world,layers", [("zb-h1", 2, 4), ("zb-h1", 4, 4), ("zb-v", 2, 4), ("zb-v", 4, 8)])
def test_zero_bubble_schedules_train_like_one_process(schedule, world, layers):
    """B's input gradients and W's weight gradients apart (real/weight_grad.py): the same training, the simulated
    bytes, and what W holds from its B (the linears' inputs and output gradients) equal to the simulator's."""
    from dataclasses import replace

    scenario = make_scenario(replace(UNTIED, layers=layers), "pp", world, micro_batch=2, microbatches=4,
                             precision="fp32", optimizer="sgd", topology="pcie", schedule=schedule)
    ranks = launch(run_rank, world, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    _check_bytes(scenario, ranks)
    simulated = simulate(scenario).ranks
    assert [r["memory"]["temporaries"] for r in ranks] == [r["memory"]["temporaries"] for r in simulated]
    assert all(r["memory"]["temporaries"] > 0 for r in ranks)


@pytest.mark.parametrize("algo,world,cp,pp,kv_heads,recompute", [
    ("ring", 2, 2, 1, None, "none"), ("ulysses", 2, 2, 1, 2, "full"), ("ring", 4, 4, 1, 2, "none"),
    ("ulysses", 4, 4, 1, None, "none"), ("ring", 4, 2, 1, None, "full"), ("ring", 4, 2, 2, None, "none")])
def test_context_parallelism_trains_like_one_process(algo, world, cp, pp, kv_heads, recompute):
    """Ring attention (zig-zag blocks, online softmax, key/value gradients passed home) and Ulysses (all-to-alls
    to heads and back), beside dp and pp and under full recomputation: one process's training, the simulated
    bytes (real/context_parallel.py)."""
    from dataclasses import replace

    scenario = make_scenario(replace(UNTIED, kv_heads=kv_heads), "3d", world, cp=cp, pp=pp, cp_algo=algo,
                             micro_batch=2, microbatches=2 * pp, precision="fp32", optimizer="sgd", topology="pcie",
                             recompute=recompute)
    ranks = launch(run_rank, world, (scenario, STEPS, 0), timeout=240)
    _check_training(ranks, single_process(scenario, STEPS, 0), 1e-6)
    _check_bytes(scenario, ranks)
