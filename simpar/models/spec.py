"""A decoder-only transformer described by its shape: parameters, FLOPs and activation bytes.

Counting rules (they reproduce the published counts exactly):
- embeddings: vocab x hidden, plus learned positions x hidden when the model has them (GPT-2);
- per layer: Q and O are hidden x hidden, K and V hidden x (kv_heads x head_dim) (GQA);
  MLP is 2 x hidden x ffn (GELU) or 3 x hidden x ffn (SwiGLU: gate, up, down);
  biases on every linear layer when ``bias``; two norms (LayerNorm: weight + bias, RMSNorm: weight);
- a final norm; an output head of vocab x hidden unless tied to the embedding.

Mixture-of-Experts (``experts`` > 0; Shazeer et al. 2017, GShard, Mixtral): after the first
``dense_layers`` layers, each layer's MLP is a router (hidden x experts, no bias) and ``experts``
expert MLPs of ``expert_ffn`` (plus ``shared_experts`` of the same size that see every token, as in
DeepSeek-MoE). A token goes to its ``top_k`` experts. Parameters count every expert; FLOPs and the
*active* parameters count the ``top_k`` routed and the shared ones. ``capacity_factor`` bounds each
expert's tokens per sequence to ceil(factor x top_k x seq / experts) (GShard's padded buffers; the rest
are dropped); None routes without dropping (Mixtral, DeepSeek-MoE).
"""

from __future__ import annotations

from dataclasses import dataclass

from simpar.errors import SimparError
from simpar.models.moe import check_moe

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    kv_heads: int | None = None  # None: same as heads (multi-head attention)
    activation: str = "gelu"
    norm: str = "layernorm"
    tied_embeddings: bool = True
    positions: int = 0  # learned position embeddings (GPT-2: 1024); 0 for rotary
    bias: bool = True
    experts: int = 0  # routed experts per MoE layer; 0: a dense model
    top_k: int = 2
    expert_ffn: int = 0  # each expert's MLP width; 0: ffn
    shared_experts: int = 0
    dense_layers: int = 0  # the first layers keep a dense MLP of ffn (DeepSeek-MoE: 1)
    capacity_factor: float | None = None

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "ffn", "vocab", "seq"):
            if getattr(self, field) < 1:
                raise SimparError(f"model {self.name}: {field} must be at least 1, got {getattr(self, field)}")
        if self.hidden % self.heads:
            raise SimparError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.n_kv_heads:
            raise SimparError(f"model {self.name}: heads {self.heads} not divisible by kv_heads {self.n_kv_heads}")
        if self.activation not in ACTIVATIONS:
            raise SimparError(f"model {self.name}: activation must be one of {', '.join(ACTIVATIONS)}")
        if self.norm not in NORMS:
            raise SimparError(f"model {self.name}: norm must be one of {', '.join(NORMS)}")
        if self.experts:
            check_moe(self)

    # -- parameters --------------------------------------------------------------------------
    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def _norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def attention_weights(self) -> int:
        """Q, O (h x h), K, V (h x kv)."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim

    def mlp_weights(self, ffn: int) -> int:
        """An MLP of width ``ffn``: 2 or 3 (SwiGLU) x h x ffn."""
        return (3 if self.activation == "swiglu" else 2) * self.hidden * ffn

    def mlp_biases(self, ffn: int) -> int:
        if not self.bias:
            return 0
        return (2 * ffn + self.hidden) if self.activation == "swiglu" else (ffn + self.hidden)

    def layer_weights(self) -> int:
        """Elements of a dense layer's weight matrices: attention and the MLP of ffn."""
        return self.attention_weights() + self.mlp_weights(self.ffn)

    def _layer_biases(self) -> int:
        if not self.bias:
            return 0
        h, f = self.hidden, self.ffn
        return 2 * h + 2 * self.kv_dim + ((2 * f + h) if self.activation == "swiglu" else (f + h))

    def layer_params(self) -> int:
        return self.layer_weights() + self._layer_biases() + 2 * self._norm_params()

    def layer_params_per_tp_rank(self, tp: int) -> int:
        """A layer's parameters on one of ``tp`` tensor-parallel ranks (Megatron): weight matrices and
        the column-parallel biases (Q, K, V, MLP up/gate) split; the row-parallel biases (O, MLP down,
        added after the all-reduce) and the norms whole on every rank."""
        replicated = self.layer_replicated_params()
        return (self.layer_params() - replicated) // tp + replicated

    def layer_replicated_params(self) -> int:
        """A layer's parameters kept whole on every TP rank: the row-parallel biases (O, MLP down)
        and the norms. With sequence parallelism each rank sees only its part of the sequence, so their
        gradients are partial sums that Megatron all-reduces over the TP group."""
        return (2 * self.hidden if self.bias else 0) + 2 * self._norm_params()

    def final_norm_params(self) -> int:
        return self._norm_params()

    def unit_kind(self, unit: int) -> str:
        """embedding (unit 0), layer, moe (a layer whose MLP is experts) or head (the last unit, layers + 1)."""
        if unit == 0:
            return "embedding"
        if unit == self.layers + 1:
            return "head"
        return "moe" if self.experts and unit > self.dense_layers else "layer"

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_width(self) -> int:
        return self.expert_ffn or self.ffn

    def expert_params(self) -> int:
        """One expert MLP's parameters."""
        return self.mlp_weights(self.expert_width) + self.mlp_biases(self.expert_width)

    def moe_layer_params(self, experts: int | None = None) -> int:
        """An MoE layer's parameters with ``experts`` routed experts (default all of them): attention, norms,
        router, the routed and the shared experts."""
        routed = self.experts if experts is None else experts
        attention = self.layer_params() - self.mlp_weights(self.ffn) - self.mlp_biases(self.ffn)
        return attention + self.hidden * self.experts + (routed + self.shared_experts) * self.expert_params()

    def unit_params(self, unit: int) -> int:
        kind = self.unit_kind(unit)
        if kind == "embedding":
            return self.embedding_params()
        if kind == "head":
            return self.head_params() + self._norm_params()
        return self.moe_layer_params() if kind == "moe" else self.layer_params()

    def unit_modules(self, kind: str) -> tuple[tuple[str, int], ...]:
        """(name, parameters) of each parameterised module of a unit (kind embedding, layer or head),
        in registration order (simpar.real.model's): what a framework that gathers ZeRO-3 parameters
        module by module (DeepSpeed) gathers at once. A tied head's output weight is the embedding's."""
        h, kv, f, b = self.hidden, self.kv_dim, self.ffn, int(self.bias)
        if kind == "moe":  # attention as a dense layer's, then the router, the shared and the routed experts
            attention = self.unit_modules("layer")[:6]
            shared = (("shared", self.shared_experts * self.expert_params()),) if self.shared_experts else ()
            routed = (("experts", self.experts * self.expert_params()),)
            return attention + (("router", h * self.experts),) + shared + routed
        if kind == "embedding":
            return (("tokens", self.vocab * h),) + ((("positions", self.positions * h),) if self.positions else ())
        if kind == "head":
            return (("norm", self._norm_params()),) + (() if self.tied_embeddings else (("out", self.vocab * h),))
        linear = (("q", h * h + b * h), ("k", h * kv + b * kv), ("v", h * kv + b * kv), ("o", h * h + b * h),
                  ("up", h * f + b * f)) + ((("gate", h * f + b * f),) if self.activation == "swiglu" else ())
        return (("norm1", self._norm_params()), ("norm2", self._norm_params())) + linear + (("down", f * h + b * h),)

    def module_tensors(self, name: str) -> int:
        """Parameter tensors of one of ``unit_modules``' modules: a norm's weight (and a LayerNorm's bias),
        an embedding's table, a linear layer's weight (and bias)."""
        if name.startswith("norm"):
            return 2 if self.norm == "layernorm" else 1
        if name in ("experts", "shared"):  # up (gate) and down of each expert
            count = self.experts if name == "experts" else self.shared_experts
            return count * (3 if self.activation == "swiglu" else 2) * (1 + int(self.bias))
        return 1 if name in ("tokens", "positions", "out", "router") else 1 + int(self.bias)

    def unit_tensors(self, kind: str) -> int:
        """Parameter tensors of a unit (the executor's ``unit.parameters()``): what it flattens, splits and
        re-points one by one around each data-parallel collective."""
        return sum(self.module_tensors(name) for name, _ in self.unit_modules(kind))

    def vocab_per_tp_rank(self, tp: int) -> int:
        """Rows of the vocabulary-parallel embedding (and head) per rank; Megatron pads the vocabulary
        up to a multiple of tp."""
        return -(-self.vocab // tp)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.positions * self.hidden

    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        return (self.embedding_params() + (self.layers - self.moe_layers) * self.layer_params()
                + self.moe_layers * self.moe_layer_params() + self._norm_params() + self.head_params())

    @property
    def active_params(self) -> int:
        """Parameters one token uses: every expert but the top_k routed ones left out (= params when dense)."""
        return self.params - self.moe_layers * (self.experts - self.top_k) * self.expert_params()

    # -- compute -----------------------------------------------------------------------------
    def layer_forward_flops(self, micro_batch: int, kind: str = "layer") -> float:
        """2 FLOPs per multiply-add of every linear layer, plus attention's QK^T and AV
        (2 x 2 x b x s^2 x hidden, counted in full as Megatron does). An MoE layer (kind moe) counts its
        router and the experts a token is routed to (top_k) and the shared ones."""
        weights = self.layer_weights()
        if kind == "moe":
            weights = (self.attention_weights() + self.hidden * self.experts
                       + (self.top_k + self.shared_experts) * self.mlp_weights(self.expert_width))
        return 2.0 * micro_batch * self.seq * weights + 4.0 * micro_batch * self.seq**2 * self.hidden

    def layers_forward_flops(self, micro_batch: int) -> float:
        """Every layer's forward FLOPs, dense and MoE."""
        return ((self.layers - self.moe_layers) * self.layer_forward_flops(micro_batch)
                + self.moe_layers * self.layer_forward_flops(micro_batch, "moe"))

    def attention_scores(self, micro_batch: int, tp: int = 1) -> int:
        """Attention scores one TP rank's layer computes, micro-batch x its heads x seq^2: what a CPU attention
        kernel's time follows beside its FLOPs (heads of 8 cost as much per score as heads of 16)."""
        return micro_batch * (self.heads // tp) * self.seq ** 2

    def head_forward_flops(self, micro_batch: int) -> float:
        """The output projection to the vocabulary (present whether or not it is tied)."""
        return 2.0 * micro_batch * self.seq * self.vocab * self.hidden

    # -- activations -------------------------------------------------------------------------
    def executor_activation_bytes(self, kind: str, micro_batch: int, weight_bytes: int, recompute: str = "none",
                                  tp: int = 1, sequence_parallel: bool = False) -> float:
        """Bytes simpar's own GPT (simpar.real.model: PyTorch autograd, scaled_dot_product_attention's
        flash kernel on CPU) saves for backward per unit, as its saved-tensor hooks count them (measured
        over tiny, small and a SwiGLU/RMSNorm/GQA variant, fp32 and bf16: tests/test_executor_activations.py).

        A layer keeps w bytes per token for: its input, the attention input (norm1 out), the residual
        after attention and the MLP input (norm2 out), 4h replicated over TP ranks (torch's composite
        RMSNorm adds, per norm, its fp32 product x·rstd, and in bf16 the fp32 copy of x: 4h or 6h bytes);
        Q, K and V (K and V repeated to h for GQA) and the
        attention output, 4h; the ffn-wide tensors, 2 for GELU (up out, GELU out), 4 for SwiGLU; these
        split over TP ranks. Plus 16 bytes a token of norm statistics (fp32) and the attention's
        log-sum-exp, w·a per token. No s² scores: the flash kernel never stores them. Full recomputation
        (torch checkpoint) keeps the unit's input. The embedding keeps its int64 ids (and position
        indices); the head its norm's input and output and the fp32 log-softmax output of the loss."""
        s, b, h, w, t = self.seq, micro_batch, self.hidden, weight_bytes, tp
        tokens = s * b
        rms = (4 if w == 4 else 6) * h if self.norm == "rmsnorm" else 0  # bytes per token per norm, beside w·h
        if kind == "embedding":
            return 8.0 * tokens + (8.0 * s if self.positions else 0.0)
        if kind == "head":  # one process: F.cross_entropy's fp32 log-softmax; TP: the vocabulary-parallel
            kept = 4.0 if t == 1 else 8.0  # cross-entropy (Megatron's) keeps the fp32 logits and probabilities
            return tokens * (2.0 * w * h + rms + kept * self.vocab_per_tp_rank(t) + 16.0)
        if recompute == "full":
            return w * tokens * h / (t if sequence_parallel else 1)
        replicated = 4 * w * h + 2 * rms
        if sequence_parallel:  # the norms work on the sequence shard; the linears keep their gathered inputs
            replicated = replicated / t + 2 * w * h
        split = w * (4 * h + (4 if self.activation == "swiglu" else 2) * self.ffn)
        return tokens * (replicated + split / t + 16.0 + w * self.heads / t)

    def layer_activation_bytes(self, micro_batch: int, recompute: str = "none", flash_attention: bool = False,
                               tp: int = 1, sequence_parallel: bool = False, fp8: bool = False) -> float:
        """Bytes a layer keeps for backward in 16-bit training (Korthikanti et al. 2022).

        none: s·b·h·(34 + 5·a·s/h) for a GELU MLP of 4h; with tensor parallelism t (no sequence
        parallelism) s·b·h·(10 + 24/t + 5·a·s/(h·t)). The 10 are replicated on every TP rank (two
        norm inputs 4, attention and MLP inputs 2 + 2, two dropout masks 1 + 1); the 24 are split
        (Q, K, V 6, attention-output input 2, the ffn-wide tensors 2 x 8). The ffn-wide share
        scales with ffn/h; SwiGLU keeps 3 ffn-wide tensors where GELU keeps 2. selective: the
        attention-score term 5·a·s²·b is recomputed (flash attention never stores it either).
        full: only the layer input, 2·s·b·h. Sequence parallelism shards the replicated 10 (and the
        input kept by full recomputation) over the t ranks too: s·b·h·(34/t + 5·a·s/(h·t)).
        fp8 (Transformer Engine): the four linear GEMMs keep their inputs as FP8 for the weight gradients, one
        byte instead of two: the QKV and MLP-up inputs (1 + 1 of the replicated 10), the attention-output
        input (1 of the split) and the MLP-down input (ffn/h of the split); full recomputation keeps the bf16
        layer input as before.
        """
        s, b, h, a = self.seq, micro_batch, self.hidden, self.heads
        shard = tp if sequence_parallel else 1
        if recompute == "full":
            return 2.0 * s * b * h / shard
        if recompute not in ("none", "selective"):
            raise SimparError(f"--recompute: must be none, selective or full, got {recompute!r}")
        ffn_tensors = 3 if self.activation == "swiglu" else 2
        replicated = 10.0 - (2 if fp8 else 0)
        split = 8 + ffn_tensors * 2 * self.ffn / h - ((1 + self.ffn / h) if fp8 else 0)
        scores = 0.0 if (recompute == "selective" or flash_attention) else 5.0 * a * s / h
        return s * b * h * (replicated / shard + (split + scores) / tp)
