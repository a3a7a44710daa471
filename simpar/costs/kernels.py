"""The kernels a Megatron-style implementation launches for one unit of a transformer, with their
shapes after the tensor-parallel split (Shoeybi et al. 2019; Korthikanti et al. 2022).

Per layer and micro-batch of b sequences of s tokens (T = b·s), hidden h, a heads of d = h/a, ffn
f, t tensor-parallel ranks, w bytes per activation element, Megatron's fused kernels (apex fused
layer norm, fused scale-mask-softmax, bias-GELU and bias-dropout-add fusions):

  forward   layernorm -> QKV GEMM (T x 3h/t x h) -> attention core -> output GEMM (T x h x h/t)
            -> bias-dropout-add -> layernorm -> MLP up GEMM (T x f/t x h; 2f/t with SwiGLU's gate)
            -> bias-GELU (or SwiGLU) -> MLP down GEMM (T x h x f/t) -> bias-dropout-add
  attention core: scores b·a/t x (s x s x d) batched GEMM, fused softmax over b·a/t·s² elements,
            dropout on them, context b·a/t x (s x d x s) batched GEMM; flash attention instead runs
            one kernel that never writes the s² scores to memory.
  backward  every GEMM becomes a data-gradient and a weight-gradient GEMM (plus a bias-gradient
            reduction when the model has biases), every memory-bound kernel its backward.

With sequence parallelism the layer norms and dropouts work on T/t tokens; without it every TP rank
repeats them on all T. Recomputation adds forward kernels to the backward: all of them (full) or
the attention core (selective, Korthikanti's definition). Parts split a layer where tensor
parallelism communicates (see strategies/megatron.py): "" whole unit; "attn" / "mlp" the two
halves; with sequence parallelism "attn_norm" / "mlp_norm" the sharded work before each half's
all-gather. With context parallelism the piece holding the attention core is cut round it: "X/pre",
"X/core" (ring attention: one key/value block's, run cp times) and "X/post".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simpar.costs.gpu import Gemm, Kernel, MemoryBound
from simpar.models import ModelSpec

# Vocabulary-parallel cross-entropy (Megatron): the logits (w bytes) read and cast to fp32, the
# maximum, the shift, the exponentials, their sum and the softmax kept for backward: about nine fp32
# passes over the b·s·V/t logits forward, three backward (softmax minus one-hot, cast back).
CROSS_ENTROPY_FWD_FP32_PASSES = 9
CROSS_ENTROPY_BWD_FP32_PASSES = 3


@dataclass(frozen=True)
class Shape:
    model: ModelSpec
    micro_batch: int
    tp: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    flash_attention: bool = False
    itemsize: int = 2  # bytes per activation element
    ep: int = 1  # expert-parallel degree (MoE layers)
    imbalance: float = 1.0  # the busiest expert's load over the mean (MoE layers without a capacity factor)
    cp: int = 1  # context-parallel degree: a rank's tokens are s / cp (strategies/context.py)
    cp_algo: str = "ring"
    fp8: bool = False  # the layers' linear GEMMs in FP8 (TrainSpec.fp8)

    @classmethod
    def of(cls, scenario) -> "Shape":
        spec, train = scenario.strategy, scenario.train
        return cls(scenario.model, train.micro_batch, spec.tp, spec.sequence_parallel, spec.recompute,
                   spec.flash_attention, train.weight_bytes, spec.ep, spec.expert_imbalance, spec.cp, spec.cp_algo,
                   train.fp8)


def _gemm(name, m, n, k, batch=1, w=2, fp8=False) -> Gemm:
    """(FP8: 1-byte operands; the output's bytes are counted as the operands', a small overstatement.)"""
    return Gemm(name, int(m), int(n), int(k), int(batch), 1 if fp8 else w, fp8=fp8)


class _Layer:
    def __init__(self, sh: Shape):
        mdl, t, w = sh.model, sh.tp, sh.itemsize
        self.sh = sh
        b, s, h, f = sh.micro_batch, mdl.seq, mdl.hidden, mdl.ffn
        self.T = b * s // sh.cp  # the rank's tokens (context parallelism: its s / cp of each sequence)
        self.Tl = self.T // t if sh.sequence_parallel else self.T  # tokens of the norms and dropouts
        heads = b * mdl.heads // t
        d = mdl.head_dim
        if sh.cp > 1 and sh.cp_algo == "ring":  # the core is one block: s / cp queries against s / cp keys
            s = s // sh.cp
        elif sh.cp > 1:  # Ulysses: all s tokens of heads / cp heads
            heads //= sh.cp
        self.w, self.h, self.f, self.t, self.heads, self.s, self.d = w, h, f, t, heads, s, d
        self.ln = MemoryBound("layernorm", 2.0 * self.Tl * h * w)
        fp8 = sh.fp8  # Transformer Engine fuses the casts of the QKV and MLP-up inputs into the layernorms, of
        # the MLP-down input into the activation; the attention output is cast by a kernel of its own
        self.qkv = _gemm("qkv", self.T, (h + 2 * mdl.kv_dim) // t, h, w=w, fp8=fp8)
        if sh.flash_attention:  # Q, K, V read and the output written once; the s² scores stay on chip
            self.core = [Gemm("flash attention", s, s, 2 * d, heads, w, io_bytes=4.0 * self.T * h / t * w)]
        else:
            scores = heads * s * s
            self.core = [_gemm("attention scores", s, s, d, heads, w),
                         MemoryBound("softmax", 2.0 * scores * w),
                         MemoryBound("attention dropout", scores * (2 * w + 1)),
                         _gemm("attention context", s, d, s, heads, w)]
        self.out = _gemm("attention output", self.T, h, h // t, w=w, fp8=fp8)
        self.casts = [MemoryBound("fp8 cast", 3.0 * self.T * h / t)] if fp8 else []  # read 2 bytes, write 1
        self.bda = MemoryBound("bias-dropout-add", self.Tl * h * (3 * w + 1))
        gated = mdl.activation == "swiglu"
        self.up = _gemm("mlp up", self.T, (2 if gated else 1) * f // t, h, w=w, fp8=fp8)
        self.act = MemoryBound("swiglu" if gated else "bias-gelu", (3 if gated else 2) * self.T * f / t * w)
        self.down = _gemm("mlp down", self.T, h, f // t, w=w, fp8=fp8)

    def around_core(self, part: str) -> dict[str, list[Kernel]]:
        """A piece holding the attention core cut round it (context parallelism: strategies/context.py)."""
        fwd = self.forward(part)
        start = fwd.index(self.core[0])
        end = start + len(self.core)
        return {"pre": fwd[:start], "core": fwd[start:end], "post": fwd[end:]}

    def forward(self, part: str) -> list[Kernel]:
        part, _, piece = part.partition("/")
        if piece:
            return self.around_core(part)[piece]
        attn_norm, attn = [self.ln], [self.qkv, *self.core, *self.casts, self.out]
        mlp_norm, mlp = [self.bda, self.ln], [self.up, self.act, self.down]
        parts = {"": attn_norm + attn + mlp_norm + mlp + [self.bda],
                 "attn": attn_norm + attn, "mlp": mlp_norm + mlp + [self.bda],
                 "attn_norm": attn_norm + [self.bda], "attn_core": attn, "mlp_norm": mlp_norm, "mlp_core": mlp}
        return parts[part]

    def backward(self, part: str) -> list[Kernel]:
        part, _, piece = part.partition("/")
        if piece in ("wgrad", "rest"):  # "X/wgrad": the weight gradient of the part's first GEMM (overlapped with the input-gradient
            first = next(k for k in self.forward(part) if isinstance(k, Gemm))  # communication); "X/rest": the rest
            grads = self._grad(first)[1:]
            return grads if piece == "wgrad" else [k for k in self.backward(part) if k not in grads]
        fwd = self.around_core(part)[piece] if piece else self.forward(part)
        recompute = self.sh.recompute
        redo = fwd if recompute == "full" else [k for k in fwd if k in self.core] if recompute == "selective" else []
        return [*redo, *(g for k in reversed(fwd) for g in self._grad(k))]

    def _grad(self, k: Kernel) -> list[Kernel]:
        w = self.w
        if isinstance(k, MemoryBound):
            factor = {"layernorm": 1.5, "softmax": 1.5, "bias-gelu": 1.5, "swiglu": 5 / 3}.get(k.name, 1.0)
            return [MemoryBound(f"{k.name} grad", factor * k.bytes)]
        if k.name == "flash attention":  # recomputes the scores: 5 of the forward's 2 matmuls' work
            return [Gemm("flash attention grad", k.m, k.n, k.k * 5 // 2, k.batch, w, io_bytes=2 * k.io_bytes)]
        if k.name.startswith("attention scores"):  # S = Q K^T: dQ = dS K, dK = dS^T Q
            return [_gemm("scores dQ", k.m, k.k, k.n, k.batch, w), _gemm("scores dK", k.n, k.k, k.m, k.batch, w)]
        if k.name.startswith("attention context"):  # C = P V: dP = dC V^T, dV = P^T dC
            return [_gemm("context dP", k.m, k.k, k.n, k.batch, w), _gemm("context dV", k.k, k.n, k.m, k.batch, w)]
        grads = [_gemm(f"{k.name} dgrad", k.m, k.k, k.n, w=w, fp8=k.fp8),
                 _gemm(f"{k.name} wgrad", k.n, k.k, k.m, w=w, fp8=k.fp8)]
        if self.sh.model.bias:
            grads.append(MemoryBound(f"{k.name} bias grad", float(k.m) * k.n * w))
        return grads


class _MoELayer(_Layer):
    """An MoE layer (kind moe): attention as a dense layer's; the router (a T x experts x h GEMM, softmax and
    top-k over fp32 logits) and the dispatch permutation; the rank's experts as one grouped GEMM (experts / ep
    of them, each on its padded slots from every ep rank: models/moe.py); the combine (the weighted gather of
    top_k outputs a token), the shared experts on every token, the residual. With tensor parallelism (and so
    sequence parallelism) the router, experts and combine work on the rank's T/t tokens. Parts
    (strategies/experts.py): "attn", "experts", "combine"; with tp > 1 "attn_norm", "attn_core", "router",
    "experts", "combine"."""

    def __init__(self, sh: Shape):
        super().__init__(sh)
        from simpar.models.moe import buffer_rows

        mdl, w, T = sh.model, sh.itemsize, self.Tl
        rows = buffer_rows(mdl, sh.micro_batch, sh.imbalance, sh.tp)
        local = mdl.experts // sh.ep
        gated = mdl.activation == "swiglu"
        fe = mdl.expert_width
        self.router = [MemoryBound("bias-dropout-add", T * self.h * (3 * w + 1)), MemoryBound("layernorm",
                                                                                           2.0 * T * self.h * w),
                       _gemm("router", T, mdl.experts, self.h, w=w),
                       MemoryBound("router softmax top-k", 3.0 * 4 * T * mdl.experts),
                       MemoryBound("dispatch permute", 2.0 * rows * self.h * w)]
        per = rows // local
        self.experts = [_gemm("experts up", per, (2 if gated else 1) * fe, self.h, batch=local, w=w),
                        MemoryBound("experts activation", (3 if gated else 2) * rows * fe * w),
                        _gemm("experts down", per, self.h, fe, batch=local, w=w)]
        shared = mdl.shared_experts * fe
        self.combine = [MemoryBound("combine", (mdl.top_k + 1) * T * self.h * w + rows * self.h * w)]
        if shared:
            self.combine += [_gemm("shared up", T, (2 if gated else 1) * shared, self.h, w=w),
                             MemoryBound("shared activation", (3 if gated else 2) * T * shared * w),
                             _gemm("shared down", T, self.h, shared, w=w)]
        self.combine.append(MemoryBound("bias-dropout-add", T * self.h * (3 * w + 1)))

    def forward(self, part: str) -> list[Kernel]:
        attn_norm, attn_core = [self.ln], [self.qkv, *self.core, *self.casts, self.out]
        parts = {"attn_norm": attn_norm, "attn_core": attn_core, "router": self.router,
                 "attn": attn_norm + attn_core + self.router, "experts": self.experts, "combine": self.combine}
        parts[""] = parts["attn"] + self.experts + self.combine
        return parts[part]


def is_weight_grad(kernel: Kernel) -> bool:
    """Whether a backward kernel computes a weight's gradient (W of a zero-bubble schedule) rather than an input's."""
    return kernel.name.endswith(("wgrad", "bias grad")) or kernel.name == "embedding grad"


@lru_cache(maxsize=4096)
def unit_kernels(sh: Shape, kind: str, phase: str, part: str = "") -> tuple[Kernel, ...]:
    """The kernels of one unit (kind: embedding, layer, head) in one phase (fwd, bwd) for one
    micro-batch, recomputation included in bwd. A backward part "X/input" is X's kernels but its weight
    gradients, "X/weight" those alone (zero-bubble schedules' B and W; "/weight": the whole unit's)."""
    base, _, piece = part.partition("/")
    if phase == "bwd" and piece in ("input", "weight"):
        return tuple(k for k in unit_kernels(sh, kind, phase, base) if is_weight_grad(k) == (piece == "weight"))
    mdl, t, w = sh.model, sh.tp, sh.itemsize
    T = sh.micro_batch * mdl.seq
    Tl = T // t if sh.sequence_parallel else T
    h, vocab = mdl.hidden, mdl.vocab_per_tp_rank(t)
    if kind in ("layer", "moe"):
        layer = _Layer(sh) if kind == "layer" else _MoELayer(sh)
        return tuple(layer.forward(part) if phase == "fwd" else layer.backward(part))
    if kind == "embedding":
        gather = MemoryBound("embedding gather", 2.0 * T * h * w)
        positions = [MemoryBound("position add", 3.0 * T * h * w)] if mdl.positions else []
        dropout = MemoryBound("embedding dropout", Tl * h * (2 * w + 1))
        if phase == "fwd":
            return (gather, *positions, dropout)
        return (MemoryBound("embedding dropout grad", dropout.bytes),
                MemoryBound("embedding grad", T * h * w + float(vocab) * h * w))
    if kind == "head":
        norm = MemoryBound("final layernorm", 2.0 * Tl * h * w)
        logits = _gemm("logits", T, vocab, h, w=w)
        entropy = MemoryBound("cross-entropy", T * vocab * (w + 4.0 * CROSS_ENTROPY_FWD_FP32_PASSES))
        pieces = {"norm": ((norm,), (MemoryBound("final layernorm grad", 1.5 * norm.bytes),)),
                  "logits": ((logits, entropy),
                             (MemoryBound("cross-entropy grad", T * vocab * (w + 4.0 * CROSS_ENTROPY_BWD_FP32_PASSES)),
                              _gemm("logits dgrad", T, h, vocab, w=w), _gemm("logits wgrad", vocab, h, T, w=w)))}
        pieces[""] = (pieces["norm"][0] + pieces["logits"][0], pieces["logits"][1] + pieces["norm"][1])
        fwd, bwd = pieces[part]
        if phase == "fwd":
            return fwd
        return bwd  # Megatron checkpoints the transformer layers only
    raise ValueError(f"unknown unit kind {kind!r}")
