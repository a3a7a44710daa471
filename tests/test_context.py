"""Context parallelism (strategies/context.py): ring attention's and Ulysses' traffic, activations divided by cp,
gradients reduced over dp x cp, and bad input."""

from __future__ import annotations

import pytest

from simpar.errors import SimparError
from simpar.models import ModelSpec
from simpar.plan import Collective, Compute
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.strategies import build_plan

GQA = ModelSpec("gqa-8", layers=8, hidden=512, heads=8, ffn=2048, vocab=1000, seq=1024, kv_heads=4)
W = 2  # bf16


def cp_calls(scenario, rank=0) -> list[Collective]:
    return [op for op in build_plan(scenario).program_of(rank).ops if isinstance(op, Collective) and op.group == "cp"]


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_ring_attention_passes_cp_minus_one_blocks_a_pass(cp, recompute):
    """Forward: cp - 1 key/value blocks a layer; backward: cp - 1 blocks and cp - 1 of their gradients; full
    recomputation: the forward's again. A block: 2 x (s / cp tokens) x kv width, per TP rank."""
    b, tp = 2, 2
    scenario = make_scenario(GQA, "3d", 2 * cp * tp, tp=tp, cp=cp, micro_batch=b, microbatches=3, recompute=recompute)
    block = 2 * b * GQA.seq // cp * GQA.kv_dim // tp * W
    calls = cp_calls(scenario)
    passes = 3 + (recompute == "full")  # forward, backward's blocks, backward's gradients, recomputation
    assert all(op.op == "shift" and op.nbytes == block for op in calls)
    assert len(calls) == 3 * GQA.layers * passes * (cp - 1)
    assert len([op for op in calls if op.payload.startswith("kv grads")]) == 3 * GQA.layers * (cp - 1)


@pytest.mark.parametrize("cp", [2, 4])
def test_ulysses_all_to_alls_swap_sequence_for_heads(cp):
    """Forward: an all-to-all of Q, K and V (the rank's s/cp tokens x (h + 2 kv) / tp), then one of the context
    (x h / tp); backward the same two; each rank sends (cp - 1)/cp of each buffer."""
    b, tp, m = 1, 1, 2
    scenario = make_scenario(GQA, "3d", 2 * cp, cp=cp, cp_algo="ulysses", micro_batch=b, microbatches=m)
    tokens = b * GQA.seq // cp
    qkv, context = tokens * (GQA.hidden + 2 * GQA.kv_dim) * W, tokens * GQA.hidden * W
    calls = cp_calls(scenario)
    assert all(op.op == "alltoall" for op in calls)
    assert sorted({op.nbytes for op in calls}) == sorted({qkv, context})
    assert sum(op.nbytes for op in calls) == 2 * m * GQA.layers * (qkv + context)
    sent = simulate(scenario).ranks[0]["bytes_sent"]  # the all-to-alls' and ZeRO-1's over dp x cp ranks
    grads = [op for op in build_plan(scenario).program_of(0).ops if isinstance(op, Collective) and op.group == "dp"]
    assert sent == sum(op.nbytes for op in calls) * (cp - 1) // cp + _ring_bytes(grads, 2 * cp)


def _ring_bytes(calls, n) -> int:
    """What one rank sends in ring reduce-scatters and all-gathers over n ranks (chunks of whole elements)."""
    from simpar.collectives.schedule import chunk_sizes

    total = 0
    for op in calls:
        chunks = chunk_sizes(op.nbytes // op.itemsize, n)
        total += (n - 1) * max(chunks) * op.itemsize if len(set(chunks)) == 1 else \
            sum(sorted(chunks)[1:]) * op.itemsize
    return total


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
def test_context_parallel_divides_activations_and_reduces_over_dp_x_cp(algo):
    base = make_scenario(GQA, "3d", 2, micro_batch=2, microbatches=2, flash_attention=True)
    split = make_scenario(GQA, "3d", 8, cp=4, cp_algo=algo, micro_batch=2, microbatches=2, flash_attention=True)
    assert (split.strategy.dp, split.strategy.replicas) == (2, 8)
    one, four = simulate(base).ranks[0]["memory"], simulate(split).ranks[0]["memory"]
    assert four["activations"] == one["activations"] // 4
    assert four["optimizer"] == one["optimizer"] // 4  # ZeRO-1 over dp x cp = 8 ranks, not dp = 2
    plan = build_plan(split)
    assert plan.grid.group(5, "cp") == (4, 5, 6, 7) and plan.grid.group(5, "dp") == tuple(range(8))
    reduce = next(op for op in plan.programs[0].ops if isinstance(op, Collective) and op.payload == "grads")
    assert reduce.group == "dp"
    # each rank runs 1/cp of every layer's work: the attention's (zig-zag balanced) too
    flops = [sum(op.flops for op in prog.ops if isinstance(op, Compute) and op.phase == "fwd" and op.unit == 1)
             for prog in (build_plan(base).programs[0], plan.programs[0])]
    assert flops[1] == pytest.approx(flops[0] / 4, rel=1e-9)


@pytest.mark.parametrize("options,message", [
    (dict(cp=3), "--cp: ring attention's zig-zag placement splits the sequence into 2 x cp chunks"),
    (dict(cp=2, cp_algo="ulysses", tp=4, gpus=16), "--cp: Ulysses gives each rank heads / (tp x cp)"),
    (dict(cp=2, cp_algo="ulysses", gpus=16, tp=1, model=ModelSpec("odd", layers=2, hidden=96, heads=6, ffn=256,
                                                                   vocab=100, seq=64)), None),
    (dict(cp=2, cp_algo="zigzag"), "--cp-algo: must be one of ring, ulysses"),
    (dict(cp=2, strategy="zero2"), "--cp: context parallelism runs in Megatron's layouts"),
    (dict(cp=3, gpus=8), "--cp: must be at least 1 and divide the 8 GPUs"),
    (dict(cp=2, pp=2, schedule="zb-h1"), "--cp: zb-h1's split backward"),
])
def test_context_parallel_bad_input(options, message):
    model = options.pop("model", ModelSpec("seq-1000", layers=4, hidden=512, heads=8, ffn=2048, vocab=1000,
                                           seq=1000, kv_heads=4))
    strategy, gpus = options.pop("strategy", "3d"), options.pop("gpus", 12)
    if message is None:  # 6 heads over cp 2: fine
        make_scenario(model, strategy, gpus, micro_batch=1, microbatches=2, **options)
        return
    with pytest.raises(SimparError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_scenario(model, strategy, gpus, micro_batch=1, microbatches=2, **options)


def test_the_published_suite_expresses_context_parallel_and_zero_bubble_cases():
    from simpar.models import model
    from simpar.published import run_case

    llama = {k: v for k, v in model("llama2-7b").__dict__.items()}
    cases = [
        {"id": "cp", "set": "T", "hardware": "dgx-h100", "quantity": "tflops_per_gpu", "measured": 100.0,
         "model": {**llama, "seq": 32768}, "layout": {"gpus": 32, "tp": 4, "pp": 1, "cp": 4},
         "options": {"cp_algo": "ring"}, "micro_batch": 1, "batch": 8, "flash_attention": True},
        {"id": "zb", "set": "T", "hardware": "dgx-a100", "quantity": "tflops_per_gpu", "measured": 100.0,
         "model": llama, "layout": {"gpus": 16, "tp": 2, "pp": 4, "schedule": "zb-h1"},
         "micro_batch": 1, "batch": 32, "recompute": "full"},
    ]
    for case in cases:
        row = run_case(case)
        assert "skipped" not in row and row["simulated"] > 0, row


def test_search_tries_context_parallel_layouts_for_long_sequences():
    from dataclasses import replace

    from simpar.search import Search, candidates

    long = replace(GQA, seq=16384)
    found = [c for c in candidates(long, 16, 32, 8) if c.cp > 1]
    assert {c.cp_algo for c in found} == {"ring", "ulysses"} and {c.cp for c in found} >= {2, 4, 8}
    assert all(c.dp * c.pp * c.tp * c.cp == 16 for c in found)
    assert not [c for c in candidates(GQA, 16, 32, 8) if c.cp > 1]  # 1K tokens: not worth splitting
    search = Search(long, 16, "dgx-h100", 32)
    outcome = search.evaluate(next(c for c in found if c.cp == 4 and c.recompute == "full"))
    assert outcome.status == "fits" and outcome.step_time_s > 0


@pytest.mark.parametrize("args,flag", [
    (["--model", "tiny", "--strategy", "3d", "--gpus", "2", "--cp", "2", "--seq", "30"], "--cp: ring attention"),
    (["--model", "llama2-7b", "--strategy", "3d", "--gpus", "64", "--tp", "8", "--cp", "8", "--cp-algo", "ulysses"],
     "--cp: Ulysses"),
    (["--strategy", "3d", "--gpus", "4", "--schedule", "zb-v"], "--schedule: zb-v"),
    (["--model", "tiny", "--seq", "0"], "--seq: must be at least 1"),
])
def test_the_cli_refuses_bad_long_context_and_zero_bubble_input_in_one_line(capsys, args, flag):
    from simpar.cli import main

    assert main(["run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"simpar: error: {flag}") and "\n" not in err, err
