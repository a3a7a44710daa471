"""What an MoE layer costs one rank and how its expert parallelism communicates.

With expert parallelism ep (> 1) an MoE layer runs in three parts (costs/kernels.py prices each):
"attn" (attention, the second norm, the router, the dispatch buffer), "experts" (this rank's
experts on the tokens the ep ranks sent it) and "combine" (the weighted sum of the experts' outputs,
the shared experts, the residual). An all-to-all over the "ep" group sits between them: dispatch
after "attn", combine after "experts"; backward mirrors them ("combine grads", then "dispatch
grads"), and full recomputation runs both forward ones again. Each moves the rank's whole buffer
(models/moe.py: experts x slots x b token copies of hidden x w bytes), (ep - 1)/ep of it to other ranks.

With tensor parallelism (Megatron-Core, sequence parallelism on) the attention runs as a TP layer's
pieces (strategies/megatron.py), then each TP rank routes its 1/tp of the sequence: "router", "experts",
"combine", the experts whole on their rank (the ep group is carved from the stage's dp x tp ranks), the
norms, router and shared experts whole on every TP rank (their gradients summed over TP after backward,
as sequence parallelism's are).

Gradients of the experts are reduced over the ranks holding the same experts ("edp", dp x tp / ep of
them), the rest of the model over the dp ranks.
"""

from __future__ import annotations

from simpar.models.moe import buffer_rows, executor_activation_bytes
from simpar.plan import Collective, Compute, Program


def dispatch_parts(tp: int) -> tuple[tuple[str, str | None], ...]:
    """The MoE parts this module adds, each with the all-to-all after it in forward (tp > 1: the attention
    comes before them as a TP layer's pieces)."""
    return (("attn" if tp == 1 else "router", "dispatch"), ("experts", "combine"), ("combine", None))


def moe_unit(work, model, spec, b: int, w: int, kept_scale: float):
    """(UnitWork of an MoE layer on one rank, {part: (fwd flops, bwd flops)}). ``kept_scale`` turns
    16-bit activation counts into the run's bytes."""
    from simpar.strategies.work import UnitWork

    s, h, t = model.seq, model.hidden, spec.tp
    tokens = b * s // t  # routed on this rank: its share of the sequence with tensor parallelism
    rows = buffer_rows(model, b, spec.expert_imbalance, t)
    expert_local = model.experts // spec.ep * model.expert_params()
    # split by TP: Q, K, V, O and the column-parallel biases; whole: the norms, O's bias, router, shared experts
    whole = model.moe_layer_params(experts=0) - model.attention_weights() - (h + 2 * model.kv_dim) * model.bias
    params = (model.moe_layer_params(experts=0) - whole) // t + whole + expert_local
    attention = (2.0 * b * s * model.attention_weights() + 4.0 * b * s * s * h) / t
    router = 2.0 * tokens * h * model.experts
    experts = 2.0 * rows * model.mlp_weights(model.expert_width)
    combine = 2.0 * tokens * (model.shared_experts * model.mlp_weights(model.expert_width) + model.top_k * h)
    forward = {"attn": attention + router, "experts": experts, "combine": combine} if t == 1 else \
        {"attn_norm": 0.0, "attn_core": attention, "router": router, "experts": experts, "combine": combine}
    redo = 1.0 if spec.recompute == "full" else 0.0
    parts = {name: (f, (2.0 + redo) * f) for name, f in forward.items()}
    if spec.recompute == "selective":
        name = "attn" if t == 1 else "attn_core"
        parts[name] = (parts[name][0], parts[name][1] + 4.0 * b * s * s * h / t)
    kept, full = moe_activation_bytes(model, b, spec, w, kept_scale)
    if work.executor_activations:  # simpar's executor's MoE layer, as measured (models/moe.py)
        full = executor_activation_bytes(model, b, w, spec.expert_imbalance)
        kept = w * b * model.seq * model.hidden if spec.recompute == "full" else full  # (checkpoint: the input)
    fwd = sum(f for f, _ in parts.values())
    bwd = sum(g for _, g in parts.values())
    unit = UnitWork(params, fwd, bwd, params * w + full, 2 * (params * w + full), kept, full - kept,
                    whole, expert_params=expert_local)
    return unit, parts


def moe_activation_bytes(model, b: int, spec, w: int, kept_scale: float) -> tuple[float, float]:
    """(kept, without recomputation) bytes an MoE layer keeps for backward per micro-batch, 16-bit: of
    Korthikanti et al.'s s·b·h·(34 + 5·a·s/h), the attention block's 11 + 5·a·s/h, the two layer norms'
    inputs 4 and the layer output's dropout mask 1; the router's fp32 logits and probabilities (8·T·experts);
    per token copy in the buffer its input and output and the ffn-wide tensors (2 for GELU, 3 for SwiGLU) at
    2 bytes each, and the shared experts' alike per token."""
    s, h, a = model.seq, model.hidden, model.heads
    tokens = s * b // spec.tp  # (tensor parallelism: sequence-parallel, every term a rank's 1/tp)
    scores = 0.0 if (spec.recompute == "selective" or spec.flash_attention) else 5.0 * a * s / h
    ffn_tensors = 3 if model.activation == "swiglu" else 2
    per_copy = 2.0 * (2 * h + ffn_tensors * model.expert_width)
    rows = buffer_rows(model, b, spec.expert_imbalance, spec.tp)
    full = (tokens * h * (16.0 + scores) + 8.0 * tokens * model.experts + rows * per_copy
            + tokens * model.shared_experts * per_copy) * kept_scale
    kept = 2.0 * tokens * h * kept_scale if spec.recompute == "full" else full
    return kept, full


def alltoall_bytes(model, b: int, spec, w: int) -> int:
    """One rank's buffer in each all-to-all: every expert's slots for its micro-batch, hidden x w bytes each."""
    return buffer_rows(model, b, spec.expert_imbalance, spec.tp) * model.hidden * w


def _alltoall(prog: Program, work, unit: int, mb: int, payload: str, deps) -> int:
    return prog.add(Collective, "comm", deps, op="alltoall", group="ep", nbytes=work.alltoall_bytes,
                    algo=work.alltoall_algo, payload=f"{payload} unit{unit} mb{mb}", units=(unit,), itemsize=work.w)


def part(prog: Program, work, unit: int, mb: int, phase: str, name: str, deps) -> int:
    """One part's compute, its memory traffic the unit's in proportion to its FLOPs."""
    u, flops = work.units[unit], work.moe_parts[name][0 if phase == "fwd" else 1]
    total = u.fwd_flops if phase == "fwd" else u.bwd_flops
    return prog.add(Compute, "compute", deps, phase=phase, unit=unit, microbatch=mb, part=name, flops=flops,
                    bytes=(u.fwd_bytes if phase == "fwd" else u.bwd_bytes) * flops / total)


def forward(prog: Program, work, unit: int, mb: int, deps) -> int:
    """The three parts of an MoE layer's forward, with the two all-to-alls under expert parallelism; returns
    the last compute."""
    for name, payload in dispatch_parts(work.tp):
        deps = [part(prog, work, unit, mb, "fwd", name, deps)]
        if payload and work.ep > 1:
            deps = [_alltoall(prog, work, unit, mb, payload, deps)]
    return deps[0]


def backward(prog: Program, work, unit: int, mb: int, deps) -> int:
    """Backward mirrors forward (full recomputation first repeats the forward's all-to-alls)."""
    if work.recompute == "full" and work.ep > 1:
        for payload in ("dispatch (recompute)", "combine (recompute)"):
            deps = [_alltoall(prog, work, unit, mb, payload, deps)]
    for name, payload in reversed(dispatch_parts(work.tp)):
        deps = [part(prog, work, unit, mb, "bwd", name, deps)]
        if name != dispatch_parts(work.tp)[0][0] and work.ep > 1:
            deps = [_alltoall(prog, work, unit, mb, "combine grads" if name == "combine" else "dispatch grads", deps)]
    return deps[0]


def grad_calls(prog: Program, work, op: str, units, deps, algo: str, payload: str = "grads",
               itemsize=None, stream: str = "comm") -> list[int]:
    """A data-parallel collective of ``units``' gradients (or parameters): all but the experts over dp, and,
    under expert parallelism, the experts over the ranks holding the same ones (edp; none when ep = dp)."""
    size = itemsize or work.w
    experts = work.expert_params(units) if work.ep > 1 else 0
    calls = [prog.add(Collective, stream, deps, op=op, group="dp", nbytes=size * (work.params(units) - experts),
                      algo=algo, payload=payload, units=tuple(units), itemsize=size)]
    if experts and work.edp > 1:
        calls.append(prog.add(Collective, stream, deps, op=op, group="edp", nbytes=size * experts, algo=algo,
                              payload=f"expert {payload}", units=tuple(units), itemsize=size))
    return calls

