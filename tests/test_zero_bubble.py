"""Zero-bubble pipeline schedules (strategies/pipeline.py): the backward split into B and W, the bubbles
they leave, the memory they hold, and their bad inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simpar.errors import SimparError
from simpar.plan import Compute, Recv, Send
from simpar.scenario import make_scenario
from simpar.sim import build_topology
from simpar.sim.breakdown import program_breakdown
from simpar.sim.runner import Simulator
from simpar.strategies import build_plan
from simpar.strategies.pipeline import SCHEDULES
from tests.test_strategies import EVEN

RATE = 1e12  # FLOP/s of the roofline GPU below: a pass of ``t`` seconds on a stage is t * RATE FLOPs


def timed_pipeline(schedule: str, m: int, times: dict[str, float], p: int = 4):
    """A pipeline of EVEN on free links where a stage's forward takes times["F"], its input-gradient backward
    times["B"] and its weight-gradient backward times["W"] (1F1B and GPipe: one backward of B + W); the
    embedding and head cost nothing. Returns the plan, the simulator and the step time."""
    scenario = make_scenario(EVEN, "pp", p, micro_batch=1, microbatches=m, topology="ring", bandwidth=1e18,
                             latency=0, schedule=schedule)
    plan = build_plan(scenario)
    layers_per_chunk = EVEN.layers // (p * scenario.strategy.chunks)
    stage_time = {"fwd": times["F"], "/input": times["B"], "/weight": times["W"], "": times["B"] + times["W"]}
    last = EVEN.layers + 1
    for prog in plan.programs:
        ops = []
        for op in prog.ops:
            if isinstance(op, Compute) and op.phase in ("fwd", "bwd"):
                seconds = 0.0 if op.unit in (0, last) else \
                    stage_time["fwd" if op.phase == "fwd" else op.part] / scenario.strategy.chunks / layers_per_chunk
                op = replace(op, flops=seconds * RATE, bytes=0.0)
            ops.append(op)
        prog.ops = ops
    topology = build_topology(scenario)
    for gpu in topology.gpus:  # a roofline GPU at RATE: a compute takes its FLOPs / RATE
        node = topology.graph.nodes[gpu]
        node["spec"] = replace(node["spec"], kernels=None, achievable_fraction=1.0, fp32_flops=RATE, tf32_flops=RATE,
                               fp16_flops=RATE, bf16_flops=RATE)
    sim = Simulator(plan, scenario, topology)
    return plan, sim, sim.run()


def idle(plan, sim, step_time) -> list[float]:
    """Each stage's bubble, the optimizer step left out."""
    result = []
    for pi, prog in enumerate(plan.programs):
        result.append(program_breakdown(sim, pi, step_time)["bubble"])
    return result


# equal times, then W shorter than F and B (as in a transformer layer), then W longer than F
TIMES = [dict(F=1.0, B=1.0, W=1.0), dict(F=1.0, B=1.5, W=0.7), dict(F=1.2, B=1.0, W=0.6), dict(F=0.8, B=1.2, W=0.9)]


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("m", [4, 8])
def test_zb_h1_idles_a_third_of_1f1b(times, m):
    """Each stage idles (p-1)(T_F + T_B - T_W) under ZB-H1 against 1F1B's (p-1)(T_F + T_B + T_W): a third at
    equal times. A deferred W fills at most the gap it lands in, so where T_W exceeds T_F (or T_B) the idle
    is (p-1) max(T_F, T_B) instead."""
    p, (f, b, w) = 4, (times["F"], times["B"], times["W"])
    for schedule, expected in (("1f1b", (p - 1) * (f + b + w)), ("zb-h1", (p - 1) * max(f + b - w, f, b))):
        plan, sim, step = timed_pipeline(schedule, m, times, p)
        for stage_idle in idle(plan, sim, step):
            assert stage_idle == pytest.approx(expected, rel=1e-6), schedule



@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_zb_v_nearly_fills_the_pipeline(times, p, m, monkeypatch):
    """ZB-V at m >= 2p: at equal times each stage idles the fill no schedule avoids (the last stage waits for
    p-1 chunk forwards) and at most one chunk pass more; at any times no more than ZB-H1."""
    from simpar.strategies.work import Work

    monkeypatch.setattr(Work, "pass_times", lambda self: (times["F"], times["B"], times["W"]))
    f, b, w = times["F"], times["B"], times["W"]
    plan, sim, step = timed_pipeline("zb-v", m, times, p)
    stages_idle = idle(plan, sim, step)
    fill = (p - 1) * f / 2
    if f == b == w:
        assert all(fill - 1e-6 <= x <= fill + f / 2 + 1e-6 for x in stages_idle)
    assert max(stages_idle) <= (p - 1) * max(f + b - w, f, b) + 1e-6


def peak_activations(schedule: str, p: int, m: int, times) -> list[int]:
    plan, sim, _ = timed_pipeline(schedule, m, times, p)
    return [sim.memory[stage].report()["activations"] for stage in range(p)]


@pytest.mark.parametrize("times", TIMES)
def test_zb_h1_holds_the_activations_of_1f1b(times):
    p, m = 4, 8
    assert peak_activations("zb-h1", p, m, times) == peak_activations("1f1b", p, m, times)
    # ZB-V: at most 2p chunks, 1F1B's first stage's p micro-batches (the head's logits aside)
    per_microbatch = EVEN.layer_activation_bytes(1) * EVEN.layers // p
    logits = 4 * EVEN.seq * EVEN.vocab
    assert all(a <= p * (per_microbatch + logits) for a in peak_activations("zb-v", p, m, times))


def test_weight_gradients_hold_their_inputs_from_b_to_w():
    """A split backward frees the layer's activations at B and holds what W reads (temporaries) until W;
    W's FLOPs are the weight-gradient GEMMs', B's the rest of the backward."""
    from simpar.strategies.work import Work

    scenario = make_scenario(EVEN, "pp", 2, micro_batch=1, microbatches=4, schedule="zb-h1")
    work, plan = Work(scenario), build_plan(scenario)
    layer = work.units[1]
    tokens, h, f = EVEN.seq, EVEN.hidden, EVEN.ffn
    assert layer.wgrad_flops == 2 * tokens * EVEN.layer_params_per_tp_rank(1) - 2 * tokens * (
        EVEN.layer_replicated_params() + EVEN.layer_params_per_tp_rank(1) - EVEN.layer_replicated_params()
        - (4 * h * h + 2 * h * f))
    assert layer.wgrad_held == 2 * tokens * (h + f + 3 * h + f + 4 * h)  # bf16, MHA, GELU
    prog = plan.programs[0]
    b = next(op for op in prog.ops if isinstance(op, Compute) and op.unit == 1 and op.part == "/input")
    w = next(op for op in prog.ops if isinstance(op, Compute) and op.unit == 1 and op.part == "/weight")
    assert b.flops + w.flops == layer.bwd_flops and w.flops == layer.wgrad_flops
    assert b.id < w.id
    held = [op for op in prog.ops if type(op).__name__ in ("Alloc", "Free") and op.category == "temporaries"]
    assert sum(op.nbytes for op in held if type(op).__name__ == "Alloc") == \
        sum(op.nbytes for op in held if type(op).__name__ == "Free") == 4 * (EVEN.layers // 2) * layer.wgrad_held


def test_zb_v_places_chunks_as_a_v_and_turns_round_without_a_send():
    p, m = 4, 8
    scenario = make_scenario(EVEN, "pp", p, micro_batch=1, microbatches=m, schedule="zb-v")
    plan = build_plan(scenario)
    per = EVEN.layers // (2 * p)
    for stage, prog in enumerate(plan.programs):
        units = sorted({op.unit for op in prog.ops if isinstance(op, Compute) and op.unit > 0 and op.phase != "step"})
        first, second = 1 + stage * per, 1 + (2 * p - 1 - stage) * per
        expected = list(range(first, first + per)) + list(range(second, second + per))
        assert [u for u in units if u <= EVEN.layers] == sorted(expected)
        sends = [op for op in prog.ops if isinstance(op, Send)]
        # a middle stage sends each micro-batch's activations and gradients once a chunk; the first stage is the
        # model's ends (nothing before its first chunk, nothing after its second), the last turns round at home
        assert len(sends) == (4 * m if 0 < stage < p - 1 else 2 * m)
        assert {op.peer for op in sends} == ({"prev"} if stage == p - 1 else {"next", "prev"} if stage else {"next"})
    for schedule in ("zb-h1", "zb-v"):  # every pass of every micro-batch, once
        plan = build_plan(make_scenario(EVEN, "pp", p, micro_batch=1, microbatches=m, schedule=schedule))
        for stage in range(p):
            order = SCHEDULES[schedule](stage, p, m, scenario.strategy.chunks if schedule == "zb-v" else 1)
            assert sorted(order) == sorted((k, mb, c) for k in "FBW" for mb in range(m)
                                           for c in range(2 if schedule == "zb-v" else 1))


@pytest.mark.parametrize("flags,message", [
    (dict(strategy="ddp", schedule="zb-h1"), "--schedule: zb-h1 fills a pipeline's bubbles"),
    (dict(strategy="pp", pp=1, schedule="zb-v"), "--schedule: zb-v fills a pipeline's bubbles"),
    (dict(strategy="pp", schedule="zb-x"), "--schedule: must be one of"),
    (dict(strategy="pp", schedule="zb-v", virtual_stages=2), "--virtual-stages"),
])
def test_zero_bubble_bad_input(flags, message):
    strategy = flags.pop("strategy")
    gpus = 2 if strategy == "pp" and flags.get("pp") != 1 else 1
    with pytest.raises(SimparError, match=message.replace("(", r"\(")):
        make_scenario(EVEN, strategy, gpus, micro_batch=1, microbatches=4, **flags)


def test_traces_and_timelines_tell_b_from_w():
    """A trace names each backward op's piece (input or weight gradient); plots.split_weight_grads draws W apart."""
    from simpar import plots
    from simpar.models import model
    from simpar.sim import simulate
    from simpar.trace import build_trace

    scenario = make_scenario(model("tiny-deep"), "pp", 2, schedule="zb-h1", microbatches=4)
    result, plan = simulate(scenario), build_plan(scenario)
    names = [e["name"] for e in build_trace(plan, result.to_json(ops=True))["traceEvents"] if e.get("ph") == "X"]
    weights = [n for n in names if n.startswith("bwd") and n.endswith("/weight")]
    inputs = [n for n in names if n.startswith("bwd") and n.endswith("/input")]
    assert weights and len(weights) == len(inputs)
    classes = [e["class"] for p in plots.split_weight_grads(result.op_timeline, plan) for e in p["ops"]]
    assert classes.count(plots.WEIGHT_GRADS) == len(weights)
