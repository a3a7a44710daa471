"""Reference-executor foundations: the real model's size, counted p2p collectives, fault teardown.

Tests that start real processes on gloo (world 2-4) are marked slow (deselect: -m 'not slow').
"""

import multiprocessing
import os
import time

import pytest
import torch

from simpar.collectives import expand
from simpar.errors import SimparError
from simpar.models import PRESETS
from simpar.real import probes
from simpar.real.launch import launch
from simpar.real.model import build_model
from simpar.topologies import build


@pytest.mark.parametrize("name", list(PRESETS))
def test_real_model_has_exactly_the_spec_parameters(name):
    spec = PRESETS[name]
    with torch.device("meta"):
        model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.params
    units = [sum(p.numel() for p in unit.parameters()) for unit in model.units]
    assert len(units) == spec.layers + 2 and sum(units) == spec.params


def test_real_model_trains_a_step():
    spec = PRESETS["tiny"]
    model = build_model(spec)
    ids = torch.randint(0, spec.vocab, (2, spec.seq))
    loss = model.loss(ids, ids)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


def _simulated_bytes(op, algo, world, nbytes):
    topo = build("ring", world, 1e9, 1e-6)
    sent = dict.fromkeys(topo.gpus, 0)
    for phase in expand(op, algo, topo, topo.gpus, nbytes):
        for t in phase.transfers:
            sent[t.src] += t.nbytes
    return [sent[g] for g in topo.gpus]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algo,op", [("ring", "allreduce"), ("ring", "reducescatter"), ("ring", "allgather"),
                                     ("ps", "allreduce")])
def test_p2p_collectives_are_right_and_send_the_simulated_bytes(world, algo, op):
    numel = 1000 * world  # whole chunks, so element and byte splits agree
    results = launch(probes.collective_worker, world, (algo, op, numel), timeout=60)
    full = sum((r + 1) * torch.arange(numel, dtype=torch.float32) for r in range(world))
    for rank, result in enumerate(results):
        expected = torch.tensor_split(full, world)[rank] if op == "reducescatter" else full
        if op == "allgather":
            expected = (torch.arange(world).repeat_interleave(numel // world) + 1) * torch.arange(numel)
        assert torch.equal(result["out"], expected.float())
    measured = [r["sent"] for r in results]
    assert measured == _simulated_bytes(op, algo, world, numel * 4)
    assert sum(r["received"] for r in results) == sum(measured)


@pytest.mark.slow
def test_a_coalesced_reduce_scatter_is_one_ring_with_the_same_sums_and_bytes_as_its_pieces_one_by_one():
    """ZeRO-3's per-unit reduce-scatter of its modules' gradients (uneven pieces, one smaller than the
    group): bit-identical to reducing each piece on its own, the same bytes, n - 1 exchanges instead
    of n - 1 per piece."""
    sizes = [7, 2, 12]
    results = launch(probes.coalesced_worker, 3, (sizes,), timeout=60)
    for result in results:
        coalesced, one_by_one = result["coalesced"], result["one by one"]
        assert torch.equal(coalesced["out"], one_by_one["out"])
        assert coalesced["sent"] == one_by_one["sent"] > 0
        assert (coalesced["exchanges"], one_by_one["exchanges"]) == (2, 2 * len(sizes))
    full = [sum((r + 1) * torch.arange(n, dtype=torch.float32) / (i + 1) for r in range(3)) for i, n in enumerate(sizes)]
    for rank, result in enumerate(results):
        assert torch.allclose(result["coalesced"]["out"], torch.cat([f.tensor_split(3)[rank] for f in full]))


def _children_of_this_process() -> list[int]:
    """Spawned rank processes still alive (or unreaped), from /proc. multiprocessing's shared
    resource tracker is a helper that outlives runs by design, so it is not counted."""
    children = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:  # it exited while we looked
            continue
        if parent == os.getpid() and b"spawn_main" in command:
            children.append(int(entry))
    return children


@pytest.mark.slow
def test_a_failing_rank_aborts_the_run_naming_rank_and_op():
    with pytest.raises(SimparError, match=r"rank 2 failed in forward of unit 1: RuntimeError: planted failure"):
        launch(probes.failing_worker, 3, (2,), timeout=60)
    assert _children_of_this_process() == [] and multiprocessing.active_children() == []


@pytest.mark.slow
def test_a_hanging_rank_is_killed_at_the_timeout_naming_rank_and_op():
    start = time.monotonic()
    with pytest.raises(SimparError, match=r"--timeout: 1 rank\(s\) did not finish within 8 s: rank 1 in "
                                          r"all-gather of unit 2"):
        launch(probes.hanging_worker, 2, (1,), timeout=8)
    assert time.monotonic() - start < 8 + 15
    assert _children_of_this_process() == [] and multiprocessing.active_children() == []


@pytest.mark.slow
def test_ranks_inherit_the_workers_modules_and_a_first_backward_and_size_their_own_threads():
    """The fork server (prewarm.py) imported the rank workers and ran the autograd pass that imports torch.fx's
    symbolic shapes: no rank pays either itself (16 ranks' worth on 2 cores)."""
    for rank in launch(probes.inherited_worker, 2, (), timeout=60):
        assert rank["modules"] == ["simpar.real.executor", "simpar.calibrate", "torch.fx.experimental.symbolic_shapes"]
        assert rank["threads"] == 1


@pytest.mark.slow
def test_ranks_that_return_at_once_all_join_before_any_leaves():
    """A rank that returns right after joining must not close its pairs under a peer still connecting them
    (gloo's "connectFullMesh failed ... closed by peer"): the closing barrier holds every rank until all joined."""
    for _ in range(5):
        assert launch(probes.returning_worker, 8, (), timeout=60) == list(range(8))


@pytest.mark.parametrize("shared", ["ctypes", "bytearray"])
def test_an_op_label_reads_back_whole_after_a_longer_one_and_clears(shared):
    """The label a fault names: each rank's own slot, a shorter label over a longer one read without its tail,
    cleared on leaving the op (launch's shared ctypes array, torchrun's bytearray)."""
    import ctypes

    from simpar.real.launch import _OP_CHARS, RankContext, _where

    ops = (multiprocessing.get_context("spawn").Array(ctypes.c_char, _OP_CHARS * 2, lock=False)
           if shared == "ctypes" else bytearray(_OP_CHARS * 2))
    first, second = RankContext(0, 2, "gloo", ops), RankContext(1, 2, "gloo", ops)
    second._set("x" * (2 * _OP_CHARS))  # cut to its slot, never into the next rank's
    with first.op("step 12 op 40: allreduce activations (tp, 0.02 MiB)"):
        with first.op("fwd unit 3 mb 0"):
            assert _where(ops, 0) == " in fwd unit 3 mb 0"
    assert _where(ops, 0) == "" and _where(ops, 1) == " in " + "x" * (_OP_CHARS - 1)


@pytest.mark.parametrize("strategy,kw,flag", [("pp", {}, "--model: tiny ties its embedding"),
                                               ("ddp", {"precision": "fp16-mixed"}, "--precision: fp16 needs loss"),
                                               ("zero3-infinity", {"precision": "bf16-mixed"}, "--precision")])
def test_executor_refuses_what_it_cannot_perform_yet(strategy, kw, flag):
    from simpar.models import model
    from simpar.real.executor import check_supported
    from simpar.scenario import make_scenario

    kw = {"precision": "fp32", **kw}
    with pytest.raises(SimparError, match=flag):
        check_supported(make_scenario(model("tiny"), strategy, 2, **kw))


def test_the_measured_step_time_is_the_slowest_ranks_mean_after_the_first_step():
    from simpar.real.compare import measured_step_time

    # each rank's mean step, the first (warm-up) left out, a stalled step counted in full; the slowest rank's
    ranks = [[0.500, 0.010, 0.030, 0.011], [0.100, 0.012, 0.020, 0.013]]
    assert measured_step_time(ranks) == pytest.approx((0.010 + 0.030 + 0.011) / 3)
    assert measured_step_time([[0.5], [0.7]]) == pytest.approx(0.7)  # one step: it is all there is


def test_the_step_in_no_op_is_the_step_less_every_op_class_mean_over_ranks():
    from simpar.real.compare import comparison, outside_ops

    def side(step, *busy):  # one rank per entry of busy: its op classes' seconds
        return {"step_time_s": step, "ranks": [{"op_time": {"forward": f, "collectives": c}} for f, c in busy]}

    real = side(0.100, (0.050, 0.042), (0.048, 0.046))  # 8 and 6 ms in no op
    assert outside_ops(real) == pytest.approx(0.007)
    assert outside_ops(side(0.090, (0.060, 0.040))) == 0.0  # overlapping streams: never below nothing
    sim = side(0.100, (0.057, 0.043), (0.057, 0.043))
    for r in (*real["ranks"], *sim["ranks"]):
        r.update(bytes_sent=0, bytes_received=0, offload_bytes=0, memory=dict.fromkeys(
            ("params", "grads", "optimizer", "activations", "buffers", "peak", "host"), 0))
        r["op_time"].update({k: 0.0 for k in ("backward", "optimizer step", "pipeline p2p", "offload copies")})
    row = comparison(sim, real)["outside_ops_s"]
    assert row["sim"] == pytest.approx(0.0) and row["real"] == pytest.approx(0.007) and row["error"] == -1.0
