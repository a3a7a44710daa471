"""What each model unit costs one rank: parameters, FLOPs, memory traffic, activations.

Shared by every strategy so they differ only in how they shard, gather and schedule.
Unit 0 is the embedding, 1..L the layers, L+1 the final norm and output head (plan.py).
With tensor parallelism t, weight matrices and column-parallel biases are split t ways (the
embedding and head along the vocabulary, padded to a multiple of t, as Megatron does); the
row-parallel biases and the norms are kept whole on every TP rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from simpar.costs.kernels import Shape, unit_kernels
from simpar.plan import Compute, Program
from simpar.scenario import Scenario
from simpar.strategies import experts


@dataclass(frozen=True)
class UnitWork:
    params: int  # parameters of this unit held by one TP rank (before any ZeRO sharding)
    fwd_flops: float
    bwd_flops: float  # gradients of inputs and weights, plus any recomputation
    fwd_bytes: float  # HBM traffic, so that small units are priced as memory-bound
    bwd_bytes: float
    activations: float  # bytes kept from forward to backward, per micro-batch
    recompute_temp: float  # bytes rebuilt during backward by recomputation, per micro-batch
    replicated: int = 0  # of ``params``, those whole on every TP rank (norms, row-parallel biases, positions)
    expert_params: int = 0  # of ``params``, this rank's routed experts (an MoE layer)
    # of the backward, the weight-gradient GEMMs (W of a zero-bubble schedule), and what W reads from B: the
    # GEMMs' inputs and their output gradients, held from B to W
    wgrad_flops: float = 0.0
    wgrad_bytes: float = 0.0
    wgrad_held: float = 0.0


class Work:
    """Per-unit costs for a scenario; ``units[u]`` for u in 0..L+1."""

    def __init__(self, scenario: Scenario):
        model, train, spec = scenario.model, scenario.train, scenario.strategy
        self.w = train.weight_bytes  # bytes per weight and per gradient element
        # main gradients (accumulated over micro-batches): fp32 in Megatron and with DeepSpeed's
        # data_types.grad_accum_dtype fp32, which makes mixed-precision Adam 2 + 4 + 12 = 18 bytes a parameter
        self.g = scenario.grad_bytes
        self.mixed = train.mixed
        self.k = train.optimizer_bytes
        # DeepSpeed's partitions: an fp32 copy of each gradient partition with mixed precision; in fp32 an
        # fp32 master copy of the parameter partition all the same (stage_1_and_2.py single_partition_of_fp32_groups)
        # (ZeRO-3 copies its gradient partition to fp32 for the step in any precision, beside the partition)
        self.fp32_grads = spec.deepspeed_habits and (self.mixed and self.g < 4 or spec.name.startswith("zero3"))
        self.fp32_master = spec.deepspeed_habits and not self.mixed
        # ZeRO-3 steps its partition a sub-group at a time, each with its fp32 gradients (DeepSpeed's sub_group_size)
        self.sub_group = spec.sub_group_size if spec.name.startswith("zero3") else None
        self.layers, self.hidden = model.layers, model.hidden
        self.recompute = spec.recompute
        b, s, h, t, c = train.micro_batch, model.seq, model.hidden, spec.tp, spec.cp
        act_scale = self.w / 2  # Korthikanti's counts assume 16-bit activations
        # context parallelism: a rank holds s / cp of each sequence's tokens, and every token-wise cost, its
        # attention's (zig-zag balanced) included, falls by cp (strategies/context.py)
        self.cp, self.cp_algo, self.tokens, self.tp = c, spec.cp_algo, b * s // c, t
        self.alltoall_algo = spec.alltoall_algo
        self.shape = Shape.of(scenario)
        token_bytes = self.tokens * h * self.w  # one hidden-state tensor of the micro-batch's tokens on this rank

        vocab = model.vocab_per_tp_rank(t)
        embedding = UnitWork(vocab * h + model.positions * h, 0.0, 0.0,
                             2 * token_bytes, 2 * token_bytes, 0.0, 0.0, model.positions * h)
        sp = spec.sequence_parallel
        # whose activations: simpar's executor GPT where the run is the executor's (the cpu-host machine),
        # else Megatron-LM's (Korthikanti et al. 2022)
        self.executor_activations = scenario.cluster.topology == "cpu-host"
        if self.executor_activations:
            kept = model.executor_activation_bytes("layer", b, self.w, spec.recompute, t, sp)
            full = model.executor_activation_bytes("layer", b, self.w, "none", t, sp)
            embedding = UnitWork(vocab * h + model.positions * h, 0.0, 0.0, 2 * token_bytes, 2 * token_bytes,
                                 model.executor_activation_bytes("embedding", b, self.w) / c, 0.0, model.positions * h)
        else:
            kept = model.layer_activation_bytes(b, spec.recompute, spec.flash_attention, t, sp, train.fp8) * act_scale
            full = model.layer_activation_bytes(b, "none", spec.flash_attention, t, sp, train.fp8) * act_scale
        kept, full = kept / c, full / c
        fwd = model.layer_forward_flops(b) / t / c
        extra = {"none": 0.0, "full": fwd, "selective": 4.0 * b * s * s * h / t / c}[spec.recompute]
        layer_params = model.layer_params_per_tp_rank(t)
        tokens = self.tokens
        layer = UnitWork(layer_params, fwd, 2 * fwd + extra, layer_params * self.w + full,
                         2 * (layer_params * self.w + full), kept, full - kept, model.layer_replicated_params(),
                         wgrad_flops=weight_grad_flops(scenario, "layer"), wgrad_bytes=layer_params * self.w,
                         wgrad_held=self.w * tokens * (_layer_gemm_io(model) / t + 4 * h))
        final_norm = model.final_norm_params()
        head_params = (0 if model.tied_embeddings else vocab * h) + final_norm
        logits = 4.0 * self.tokens * vocab  # fp32 logits kept for the cross-entropy backward
        kept_head = model.executor_activation_bytes("head", b, self.w, tp=t) / c if self.executor_activations else logits
        head_fwd = model.head_forward_flops(b) / t / c
        head = UnitWork(head_params, head_fwd, 2 * head_fwd, vocab * h * self.w + logits,
                        2 * (vocab * h * self.w + logits), kept_head, 0.0, final_norm,
                        wgrad_flops=weight_grad_flops(scenario, "head"), wgrad_bytes=vocab * h * self.w,
                        wgrad_held=self.w * tokens * (h + vocab))
        self.ep, self.edp = spec.ep, spec.dp * spec.tp // spec.ep
        layers = [layer] * model.layers
        if model.experts:  # MoE layers after the dense ones (strategies/experts.py)
            moe, self.moe_parts = experts.moe_unit(self, model, spec, b, self.w,
                                                   self.w if self.executor_activations else act_scale)
            self.alltoall_bytes = experts.alltoall_bytes(model, b, spec, self.w)
            layers = [moe if model.unit_kind(1 + i) == "moe" else layer for i in range(model.layers)]
        self.model = model
        self.units = [embedding] + layers + [head]
        # Transformer Engine's FP8 weights, kept across micro-batches: each linear weight cast to FP8 and its
        # transpose (Hopper's FP8 GEMMs take one layout only, so the data gradient reads a transposed copy)
        self.fp8_weight_bytes = 2 * model.layer_weights() // t if train.fp8 else 0
        self.stage_size = spec.replicas * t  # ranks of a pipeline stage (group "stage")
        # Megatron-Core's --tp-comm-overlap (userbuffers) hides the forward's TP collectives under its GEMMs, and
        # the backward's output-gradient all-gathers under the data gradients they feed
        self.userbuffers = spec.tp_comm_userbuffers  # (make_scenario: only with sp, tp > 1, no cp)

    @property
    def num_units(self) -> int:
        return len(self.units)

    def piece_work(self, phase: str, part: str) -> tuple[float, float]:
        """FLOPs and memory traffic of a layer's piece as the kernel model counts them (context parallelism's
        pieces round the attention core: strategies/context.py)."""
        kernels = unit_kernels(self.shape, "layer", phase, part)
        return sum(getattr(k, "flops", 0.0) for k in kernels), sum(k.bytes for k in kernels)

    def pass_times(self) -> tuple[float, float, float]:
        """A layer's forward, input-gradient and weight-gradient work (FLOPs; their ratio steers ZB-V)."""
        layer = self.units[1]
        return layer.fwd_flops, layer.bwd_flops - layer.wgrad_flops, layer.wgrad_flops

    def params(self, units) -> int:
        return sum(self.units[u].params for u in units)

    def expert_params(self, units) -> int:
        return sum(self.units[u].expert_params for u in units)

    def shard(self, units, n: int) -> float:
        """A rank's share of ``units``' parameters sharded over n data-parallel ranks: under expert parallelism
        the experts over the n / ep ranks that hold the same ones."""
        experts = self.expert_params(units) if self.ep > 1 else 0
        return (self.params(units) - experts) / n + experts / self.edp

    def split_moe(self, unit: int) -> bool:
        """Whether a unit is an MoE layer run in parts (strategies/experts.py): its experts on other ranks too
        (all-to-alls inside it), or its attention split by tensor parallelism."""
        return (self.ep > 1 or self.tp > 1) and self.model.unit_kind(unit) == "moe"

    def forward(self, prog: Program, unit: int, mb: int, deps=()) -> int:
        """Store the unit's activations for backward and run its forward; returns the compute op."""
        u = self.units[unit]
        if u.activations:
            prog.alloc("compute", "activations", u.activations, payload=f"unit{unit} mb{mb}")
        if self.split_moe(unit):
            return experts.forward(prog, self, unit, mb, deps)
        return prog.add(Compute, "compute", deps, phase="fwd", unit=unit, microbatch=mb,
                        flops=u.fwd_flops, bytes=u.fwd_bytes)

    def backward(self, prog: Program, unit: int, mb: int, deps=()) -> int:
        """Backward of a unit (rebuilding recomputed activations first); frees its activations."""
        u = self.units[unit]
        if u.recompute_temp:
            prog.alloc("compute", "temporaries", u.recompute_temp, payload=f"recompute unit{unit} mb{mb}")
        if self.split_moe(unit):
            op = experts.backward(prog, self, unit, mb, deps)
        else:
            op = prog.add(Compute, "compute", deps, phase="bwd", unit=unit, microbatch=mb,
                          flops=u.bwd_flops, bytes=u.bwd_bytes)
        if u.recompute_temp:
            prog.free("compute", "temporaries", u.recompute_temp, payload=f"recompute unit{unit} mb{mb}")
        if u.activations:
            prog.free("compute", "activations", u.activations, payload=f"unit{unit} mb{mb}")
        return op

    def gpu_step(self, prog: Program, params: int, deps=()) -> int:
        """The optimizer step on the GPU: memory-bound, reading and writing every state once."""
        return prog.add(Compute, "compute", deps, phase="step", params=params,
                        bytes=params * (2 * self.w + 2 * self.k))

    def static(self, prog: Program, params: float, grads: float, optimizer: float,
               optimizer_memory: str = "gpu", params_memory: str = "gpu") -> None:
        """Model states held for the whole step."""
        for category, nbytes, memory in (("params", params, params_memory), ("grads", grads, "gpu"),
                                         ("optimizer", optimizer, optimizer_memory)):
            if nbytes:
                prog.alloc("compute", category, nbytes, memory=memory, payload="model states")
        optimized = optimizer / self.k if self.k else 0  # parameters this rank's optimizer updates (SGD: no state)
        if self.fp32_grads and optimizer and optimizer_memory == "gpu":  # DeepSpeed's fp32 gradient of each
            prog.alloc("compute", "grads", 4 * min(optimized, self.sub_group or optimized),  # (a sub-group's
                       payload="model states")  # worth at a time with ZeRO-3)
        if self.fp32_master and optimizer:
            prog.alloc("compute", "optimizer", 4 * optimized, memory=optimizer_memory, payload="model states")


def _layer_gemm_io(model) -> int:
    """Per token, the elements a layer's weight gradients read that tensor parallelism splits: the attention
    context (the output projection's input), the MLP's activation (the down projection's input) and the
    output gradients of the QKV and MLP-up (and gate) GEMMs; the attention's and MLP's normed inputs and the two
    row-parallel outputs' gradients (4 h a token, whole on every TP rank) are added by the caller."""
    gated = 2 if model.activation == "swiglu" else 1
    return model.hidden + model.ffn + (model.hidden + 2 * model.kv_dim) + gated * model.ffn


def weight_grad_flops(scenario: Scenario, kind: str) -> float:
    """FLOPs of a unit's weight-gradient GEMMs on one rank, from the kernels the GPU model prices."""
    return sum(getattr(k, "flops", 0.0) for k in unit_kernels(Shape.of(scenario), kind, "bwd", "/weight"))


def buckets(work: Work, units, capacity: int) -> list[tuple[int, ...]]:
    """Group units (in the order given: backward order) into gradient buckets of at least
    ``capacity`` bytes, as DDP does; the last bucket takes what is left."""
    result, current, size = [], [], 0
    for unit in units:
        current.append(unit)
        size += work.units[unit].params * work.w
        if size >= capacity:
            result.append(tuple(current))
            current, size = [], 0
    if current:
        result.append(tuple(current))
    return result
