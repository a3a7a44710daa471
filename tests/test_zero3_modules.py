"""ZeRO-3 module by module (DeepSpeed's granularity): which module gathers a step needs, exactly."""

import pytest

from simpar.errors import SimparError
from simpar.models import model
from simpar.plan import Alloc, Collective, Compute
from simpar.real.model import build_model
from simpar.real.states import module_parameters
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.strategies import build_plan

TINY = model("tiny")  # tied embedding; every module divides by 4
W, N = 2, 4  # bf16, ranks


def _sent(**kw) -> int:
    return simulate(make_scenario(TINY, "zero3", N, **kw)).ranks[0]["bytes_sent"]


def _ring(params: int) -> int:
    return (N - 1) * W * params // N


@pytest.mark.parametrize("name", ["tiny", "gpt2", "llama2-7b"])
def test_modules_are_the_executor_models_modules(name):
    spec = model(name)
    if spec.layers > 2:  # the same shapes, fewer layers: the modules of a unit do not depend on depth
        spec = model(name).__class__(**{**spec.__dict__, "layers": 1, "hidden": 128, "heads": 4,
                                        "kv_heads": min(spec.n_kv_heads, 4) if spec.kv_heads else None,
                                        "ffn": 256, "vocab": 512})
    real = build_model(spec)
    for unit, kind in ((0, "embedding"), (1, "layer"), (spec.layers + 1, "head")):
        sizes = [sum(p.numel() for p in module) for module in module_parameters(real.units[unit])]
        assert sizes == [params for _, params in spec.unit_modules(kind)]


def test_every_use_gathers_without_reuse_or_prefetch():
    """Forward and backward gather each module (a tied head the embedding's table too); gradients
    are reduce-scattered once: 2(Φ + V·h) + Φ per micro-batch."""
    table = TINY.vocab * TINY.hidden
    assert _sent(prefetch=0, microbatches=2) == 2 * (_ring(2 * (TINY.params + table)) + _ring(TINY.params))


def test_recomputation_gathers_each_layer_again():
    layers = TINY.layers * TINY.layer_params()
    plain = _sent(prefetch=0)
    assert _sent(prefetch=0, recompute="full") == plain + _ring(layers)
    # gathering whole layers, the backward's gather serves the recomputation
    assert _sent(gather_granularity="layer", recompute="full") == _sent(gather_granularity="layer")


def test_modules_used_again_soon_stay_gathered():
    # the head's backward directly follows its forward: prefetched, so kept (its modules not gathered again)
    table = TINY.vocab * TINY.hidden
    head = TINY.final_norm_params() + table
    assert _sent(prefetch=1) == _sent(prefetch=0) - _ring(head)
    # within DeepSpeed's reuse distance everything stays: one gather per module per step
    assert _sent(max_reuse_distance=10**12, microbatches=3) == _ring(TINY.params) + 3 * _ring(TINY.params)


def test_one_all_gather_per_module_and_a_coalesced_reduce_scatter_per_unit():
    plan = build_plan(make_scenario(TINY, "zero3", N, prefetch=0))
    ops = [op for op in plan.programs[0].ops if isinstance(op, Collective)]
    modules = 2 + TINY.layers * 8 + 1  # embedding (tokens, positions), layers, head norm
    assert sum(op.op == "allgather" for op in ops) == 2 * (modules + 1)  # + the tied table, twice
    scatters = [op for op in ops if op.op == "reducescatter"]
    assert len(scatters) == TINY.layers + 2 and all(sum(op.pieces) == op.nbytes for op in scatters)


def test_module_gathers_cost_latency_at_scale():
    gpt = model("gpt2-xl")
    layer = simulate(make_scenario(gpt, "zero3", 64, gather_granularity="layer"))
    module = simulate(make_scenario(gpt, "zero3", 64))
    assert module.step_time_s > layer.step_time_s


@pytest.mark.parametrize("options,field", [({"gather_granularity": "modules"}, "--gather-granularity"),
                                           ({"max_reuse_distance": -1}, "--max-reuse-distance")])
def test_bad_zero3_options_name_the_flag(options, field):
    with pytest.raises(SimparError, match=field):
        make_scenario(TINY, "zero3", N, **options)
    with pytest.raises(SimparError, match="--gather-granularity"):
        make_scenario(TINY, "zero2", N, gather_granularity="module")


def test_persistent_small_modules_are_gathered_once_after_the_step():
    """stage3_param_persistence_threshold: modules this small (the norms: h parameters) stay whole on every
    rank; not gathered in forward or backward, gathered once, coalesced, after the optimizer step."""
    small = max(p for kind in ("layer", "head") for name, p in TINY.unit_modules(kind) if name.startswith("norm"))
    norms = TINY.layers * 2 * small + TINY.final_norm_params()  # each norm: weight and bias
    plain, kept = (_sent(prefetch=0, microbatches=2, param_persistence_threshold=t) for t in (0, small))
    # every norm gathered in forward and backward of both micro-batches before; once now
    assert kept == plain - 2 * 2 * _ring(norms) + _ring(norms)
    plan = build_plan(make_scenario(TINY, "zero3", N, param_persistence_threshold=small))
    ops = plan.programs[0].ops
    last = [op for op in ops if isinstance(op, Collective)][-1]
    assert (last.op, last.payload, sum(last.pieces)) == ("allgather", "persistent params", W * norms)
    first_compute = next(i for i, op in enumerate(ops) if isinstance(op, Compute))
    resident = [op for op in ops[:first_compute] if isinstance(op, Alloc) and op.category == "buffers"
                and op.nbytes <= W * small]  # (not the prefetched gathers' buffers)
    assert sum(op.nbytes for op in resident) == W * norms  # whole from the step's start


def test_deepspeed_releases_everything_but_persistent_modules_when_a_backward_ends():
    """With DeepSpeed's habits, gathered modules are released at the end of each micro-batch's backward,
    whatever the reuse distance: every micro-batch gathers them again; persistent ones stay (gathered once,
    after the step). Gradients are reduce-scattered every micro-batch."""
    small = max(p for _, p in TINY.unit_modules("layer") if p < 1000)
    norms = TINY.layers * 2 * small + TINY.final_norm_params()
    every = _sent(max_reuse_distance=10**12, microbatches=3, deepspeed_habits=True, param_persistence_threshold=small)
    assert every == 3 * _ring(TINY.params) + 3 * _ring(TINY.params - norms) + _ring(norms)


def test_max_live_parameters_caps_what_reuse_keeps():
    """A reuse distance that keeps everything, capped by stage3_max_live_parameters: with no room, every
    module is released after use as with no reuse; with room for everything, one gather per module."""
    everything, nothing = 10**12, 0
    assert _sent(max_reuse_distance=everything, max_live_parameters=nothing, prefetch=0) == _sent(prefetch=0)
    assert _sent(max_reuse_distance=everything, max_live_parameters=everything) == \
        _sent(max_reuse_distance=everything)
    capped = _sent(max_reuse_distance=everything, max_live_parameters=TINY.layer_params(), prefetch=0)
    assert _sent(max_reuse_distance=everything, prefetch=0) < capped < _sent(prefetch=0)


def test_sub_group_size_bounds_the_fp32_gradients():
    """DeepSpeed's ZeRO-3 holds fp32 gradients for one sub-group of its partition at a time, beside its
    16-bit gradient partition."""
    def grads(**kw):
        scenario = make_scenario(TINY, "zero3", N, precision="bf16-mixed", deepspeed_habits=True, **kw)
        return simulate(scenario).ranks[0]["memory"]["grads"]
    assert grads() == W * TINY.params / N + 4 * TINY.params / N
    assert grads(sub_group_size=1000) == W * TINY.params / N + 4 * 1000
