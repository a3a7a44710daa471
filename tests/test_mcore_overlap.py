"""Megatron-Core's overlaps (--overlap-grad-reduce, --overlap-param-gather, --tp-comm-userbuffers): the same
bytes as without them, each collective where Megatron-Core launches it, and the fast path held to the events."""

import pytest

from simpar.errors import SimparError
from simpar.models import model
from simpar.plan import Collective, Compute
from simpar.scenario import make_scenario
from simpar.sim import build_topology, fast, simulate
from simpar.strategies import build_plan

GPT = model("gpt2-medium")
OVERLAPS = dict(overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_userbuffers=True,
                tp_comm_overlap=True)


def _scenario(**options):
    base = dict(pp=2, dp=2, tp=2, microbatches=4, sequence_parallel=True, flash_attention=True, topology="dgx-h100")
    return make_scenario(GPT, "3d", 8, **{**base, **options})


def test_the_overlaps_move_no_byte_and_hide_communication():
    plain, overlapped = simulate(_scenario()), simulate(_scenario(**OVERLAPS))
    assert [(r["bytes_sent"], r["bytes_received"]) for r in plain.ranks] == \
        [(r["bytes_sent"], r["bytes_received"]) for r in overlapped.ranks]
    assert overlapped.breakdown["communication"] < plain.breakdown["communication"]
    assert overlapped.step_time_s < plain.step_time_s


def test_each_bucket_is_reduced_as_the_last_micro_batch_finishes_it_and_gathered_ahead():
    scenario = _scenario(overlap_grad_reduce=True, overlap_param_gather=True)
    last_mb = scenario.microbatches - 1
    for prog in build_plan(scenario).programs:
        ops = prog.ops
        grads = [op for op in ops if isinstance(op, Collective) and op.group == "dp" and op.payload == "grads"]
        gathers = [op for op in ops if isinstance(op, Collective) and op.group == "dp" and op.payload == "params"]
        assert grads and gathers and all(op.stream == "dp" for op in grads + gathers)
        for op in grads:
            parents = [ops[d] for d in op.deps]
            assert parents and all(isinstance(p, Compute) and p.phase == "bwd" and p.microbatch == last_mb
                                   and p.unit in op.units for p in parents)
        first_compute = next(i for i, op in enumerate(ops) if isinstance(op, Compute))
        assert all(op.id < first_compute and not op.deps for op in gathers)  # at the step's start
        for gather in gathers:  # each unit's first forward waits for its bucket
            first = next(op for op in ops if isinstance(op, Compute) and op.phase == "fwd" and op.unit in gather.units)
            assert gather.id in first.deps


def test_the_forward_gemms_do_not_wait_for_their_all_gather():
    ops = build_plan(_scenario(tp_comm_userbuffers=True)).programs[0].ops
    cores = [op for op in ops if isinstance(op, Compute) and op.phase == "fwd" and op.part.endswith("_core")]
    assert cores and all(not any(isinstance(ops[d], Collective) for d in op.deps) for op in cores)


@pytest.mark.parametrize("options", [dict(tp_comm_overlap=True), dict(tp_comm_overlap=True, tp_comm_userbuffers=True),
                                     dict(tp_comm_userbuffers=True)])  # (userbuffers include the backward overlap)
def test_the_backward_data_gradient_streams_its_output_gradient_gather_with_userbuffers(options):
    userbuffers = options.get("tp_comm_userbuffers", False)
    ops = build_plan(_scenario(**options)).programs[0].ops
    rests = [op for op in ops if isinstance(op, Compute) and op.part.endswith("_core/rest")]
    assert rests
    for rest in rests:
        gathers = [op for op in ops if isinstance(op, Collective) and op.payload == f"output grads unit{rest.unit} "
                   f"mb{rest.microbatch}" and op.op == "allgather" and op.id < rest.id]
        gather = gathers[-1]  # the gather of this half's output gradient, issued just before its backward
        assert (gather.id in rest.deps) != userbuffers
        if userbuffers:  # the weight gradient and the input gradient's reduce-scatter need all of it
            after = [op for op in ops if rest.id in op.deps]
            assert after and all(gather.id in op.deps for op in after)


@pytest.mark.parametrize("options", [OVERLAPS, dict(overlap_grad_reduce=True)])
def test_the_fast_path_prices_the_overlaps_as_the_events(options):
    scenario = _scenario(**options)
    topology, plan = build_topology(scenario), build_plan(scenario)
    full = simulate(scenario, topology=topology, plan=plan).step_time_s
    assert fast.step_time(plan, scenario, topology) == pytest.approx(full, rel=5e-3)


@pytest.mark.parametrize("options,message", [
    (dict(tp_comm_userbuffers=True, sequence_parallel=False), "--tp-comm-userbuffers: Transformer Engine"),
    (dict(tp_comm_userbuffers=True, tp=1, dp=4), "--tp-comm-userbuffers"),
    (dict(tp_comm_userbuffers=True, dp=1, cp=2), "--tp-comm-userbuffers: not modelled together with --cp"),
])
def test_bad_overlap_flags_name_the_flag(options, message):
    with pytest.raises(SimparError, match=message):
        _scenario(**options)
    with pytest.raises(SimparError, match="--overlap-grad-reduce: Megatron-Core's overlap"):
        make_scenario(GPT, "zero2", 8, overlap_grad_reduce=True)


def test_the_executor_refuses_to_gather_ahead():
    from simpar.real.support import check_supported

    with pytest.raises(SimparError, match="--overlap-param-gather: the executor"):
        check_supported(make_scenario(model("tiny-deep"), "3d", 2, dp=2, overlap_param_gather=True))
