"""A Scenario: model, training, strategy and cluster, validated once so every builder can trust it.

``make_scenario`` resolves the parallel layout (which of dp, pp, tp the user gave, and what the
rest must be) and rejects impossible ones with one message naming the flag to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simpar.errors import SimparError
from simpar.models import ModelSpec
from simpar.train import TrainSpec

DATA_PARALLEL = ("dp", "ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "zero3-infinity", "hsdp")
MODEL_PARALLEL = ("pp", "tp", "3d")
STRATEGY_NAMES = DATA_PARALLEL + MODEL_PARALLEL
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
RECOMPUTE = ("none", "selective", "full")
GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # --grad-accum-dtype -> bytes per main-gradient element
GRAD_DTYPES = tuple(GRAD_BYTES)
GRANULARITIES = ("module", "layer")  # ZeRO-3 all-gathers: one per module (DeepSpeed) or per layer


@dataclass(frozen=True)
class StrategySpec:
    name: str = "ddp"
    dp: int = 1
    pp: int = 1
    tp: int = 1
    algo: str | None = None  # collective algorithm for data-parallel traffic; None: ring
    bucket_bytes: int = 25 * 2**20  # DDP / ZeRO gradient bucket
    prefetch: int = 1  # ZeRO-3: units gathered ahead of the one computing
    schedule: str = "1f1b"
    virtual_stages: int = 1  # interleaved pipeline: model chunks per rank
    recompute: str = "none"
    flash_attention: bool = False
    overlap_comm: bool = True  # False: a rank's communication waits for its compute and the reverse
    sequence_parallel: bool = False  # Korthikanti et al. 2022: TP all-reduces become reduce-scatter + all-gather
    # Megatron's async TP communication in backward: a column-parallel GEMM's input-gradient all-reduce
    # (reduce-scatter with sp) runs while its weight-gradient GEMM computes
    tp_comm_overlap: bool = False
    # Megatron-Core's distributed optimizer habits (3d/pp/tp across data-parallel ranks): each gradient bucket's
    # reduce-scatter starts as the last micro-batch's backward finishes it, and the parameters' all-gather runs
    # bucket by bucket under the next step's first forward (steady state: this step's, gathering the last)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # Megatron-Core's --tp-comm-overlap (Transformer Engine userbuffers): the forward's sequence-parallel
    # all-gathers and reduce-scatters stream under their GEMMs, and in the backward the output gradient's
    # all-gather under the data-gradient GEMM it feeds (Megatron-LM's tp_comm_overlap: the backward's
    # reduce-scatter under the weight gradient only; userbuffers include it)
    tp_comm_userbuffers: bool = False
    grad_accum_dtype: str | None = None  # main gradients: fp32 | bf16 | fp16 (None: the weights' dtype)
    # ZeRO-3: gather the parameters a module at a time (DeepSpeed) or a layer at a time (FSDP's usual
    # wrapping); None: module for zero3, layer for its offload variants (which simpar moves by layer)
    gather_granularity: str | None = None
    # ZeRO-3 by module: a gathered module stays if it is used again within this many parameters of
    # other modules' uses (DeepSpeed's stage3_max_reuse_distance); 0 releases after every use
    max_reuse_distance: int = 0
    # DeepSpeed's habits (set by --deepspeed): the optimizer's fp32 copy of each gradient partition
    # (mixed-precision Adam 2 + 2 + 4 + 12 = 18 bytes a parameter beside the 16-bit weights; in fp32 an
    # fp32 master copy of the partition instead), ZeRO-1/2 gradients reduced by all-reduce (then
    # partitioned); and ZeRO-3 parameter shards in host memory, fetched over PCIe before every gather
    # (offload_param)
    deepspeed_habits: bool = False
    offload_params: bool = False
    # DeepSpeed's ZeRO-3 knobs (zero3 by module): modules of at most this many parameters stay whole on
    # every rank, gathered once after the step (stage3_param_persistence_threshold); at most this many
    # parameters kept gathered for reuse (stage3_max_live_parameters); the optimizer steps (and holds
    # fp32 gradients for) this many parameters at a time (sub_group_size). 0 / None: off
    param_persistence_threshold: int = 0
    max_live_parameters: int | None = None
    sub_group_size: int | None = None
    # Mixture-of-Experts: each MoE layer's experts split over ep ranks of the data-parallel group (an
    # all-to-all sends each token to its experts' rank and back); their gradients are reduced over the
    # dp x tp / ep ranks holding the same experts. The busiest expert's load over the mean (1: uniform routing)
    ep: int = 1
    expert_imbalance: float = 1.0
    alltoall_algo: str = "pairwise"  # pairwise | hierarchical
    # ZeRO++ (Wang et al. 2023), zero3: int8 weights in the forward all-gather (qwZ), a secondary partition of
    # the weights over this many ranks of a node for the backward all-gather (hpZ; 0 off), int4 gradients in
    # a hierarchical reduce-scatter (qgZ). hsdp: the ranks one shard spans (None: a node's GPUs)
    zeropp_qwz: bool = False
    zeropp_hpz: int = 0
    zeropp_qgz: bool = False
    shard_size: int | None = None
    # context parallelism (strategies/context.py): each sequence split over cp ranks that hold the same weights,
    # attention by ring (key/value blocks passed round, zig-zag placement) or Ulysses (all-to-alls to heads)
    cp: int = 1
    cp_algo: str = "ring"

    @property
    def replicas(self) -> int:
        """Ranks of a stage and TP index holding the same weights: the data-parallel ranks x the context-parallel
        ones (gradients are reduced, and ZeRO shards, over all of them)."""
        return self.dp * self.cp

    @property
    def world(self) -> int:
        """Ranks in all: replicas x pipeline stages x tensor-parallel ranks."""
        return self.replicas * self.pp * self.tp

    @property
    def chunks(self) -> int:
        """Model chunks a pipeline stage holds: the interleaved schedule's virtual stages, ZB-V's two."""
        return 2 if self.schedule == "zb-v" else self.virtual_stages

    @property
    def zeropp(self) -> bool:
        return self.zeropp_qwz or self.zeropp_qgz or self.zeropp_hpz > 1


@dataclass(frozen=True)
class ClusterSpec:
    topology: str = "dgx-a100"
    gpus: int = 8
    bandwidth: float | None = None  # ring / star links only
    latency: float | None = None
    device: str | None = None  # a GPU preset replacing the topology's own (--device)


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    train: TrainSpec
    strategy: StrategySpec
    cluster: ClusterSpec = field(default_factory=ClusterSpec)

    @property
    def gather_granularity(self) -> str:
        """ZeRO-3's unit of all-gather: module or layer (see StrategySpec)."""
        spec = self.strategy
        by_module = (spec.name == "zero3" and not spec.zeropp) or (spec.deepspeed_habits and spec.name == "zero3-offload")
        return spec.gather_granularity or ("module" if by_module else "layer")

    @property
    def node_gpus(self) -> int:
        """GPUs of one node of the cluster (all of them on one machine)."""
        from simpar.topologies.builders import node_size

        return node_size(self.cluster.topology, self.cluster.gpus)

    @property
    def grad_bytes(self) -> int:
        """Bytes per main-gradient element: the --grad-accum-dtype's, else the weights'."""
        return GRAD_BYTES.get(self.strategy.grad_accum_dtype, self.train.weight_bytes)

    @property
    def microbatches(self) -> int:
        """Micro-batches per rank per step: gradient accumulation, or the pipeline's m."""
        return self.train.grad_accumulation(self.strategy.dp)


def resolve_degrees(name: str, gpus: int, dp: int | None, pp: int | None, tp: int | None) -> tuple[int, int, int]:
    """Fill in the degrees the user left out so that dp * pp * tp = gpus."""
    if name in DATA_PARALLEL:
        for flag, value in (("--pp", pp), ("--tp", tp)):
            if value not in (None, 1):
                raise SimparError(f"{flag}: strategy {name} is data-parallel only; use --strategy 3d "
                                  f"(or pp / tp) to combine parallelisms")
        if dp not in (None, gpus):
            raise SimparError(f"--dp: strategy {name} uses every GPU for data parallelism "
                              f"(--dp {gpus}), got {dp}")
        return gpus, 1, 1
    given = {"dp": dp, "pp": pp, "tp": tp}
    # Which degree absorbs the remaining GPUs when left out: the strategy's own one, else dp.
    free = {"pp": "pp", "tp": "tp", "3d": "dp"}[name]
    if given[free] is not None:
        free = next((k for k in ("dp", "pp", "tp") if given[k] is None), None)
    known = {k: (v if v is not None else 1) for k, v in given.items()}
    for key, value in known.items():
        if value < 1:
            raise SimparError(f"--{key}: must be at least 1, got {value}")
    if free is not None:
        others = 1
        for key in ("dp", "pp", "tp"):
            if key != free:
                others *= known[key]
        if gpus % others:
            raise SimparError(f"--gpus: {gpus} GPUs are not divisible by the given degrees "
                              f"({' x '.join(f'{k} {known[k]}' for k in known if k != free)} = {others})")
        known[free] = gpus // others
    product = known["dp"] * known["pp"] * known["tp"]
    if product != gpus:
        raise SimparError(f"--gpus: {gpus} GPUs do not match dp {known['dp']} x pp {known['pp']} x "
                          f"tp {known['tp']} = {product}")
    return known["dp"], known["pp"], known["tp"]


def make_scenario(model: ModelSpec, strategy: str = "ddp", gpus: int = 8, *, topology: str = "dgx-a100",
                  micro_batch: int = 1, global_batch: int | None = None, microbatches: int | None = None,
                  precision: str = "bf16-mixed", optimizer: str = "adam", dp: int | None = None,
                  pp: int | None = None, tp: int | None = None, bandwidth: float | None = None,
                  latency: float | None = None, device: str | None = None, **options) -> Scenario:
    """Build and validate a Scenario; ``options`` are further StrategySpec fields."""
    name = strategy.strip().lower()
    if name not in STRATEGY_NAMES:
        raise SimparError(f"--strategy: unknown {strategy!r}; choose from {', '.join(STRATEGY_NAMES)}")
    if gpus < 1:
        raise SimparError(f"--gpus: must be at least 1, got {gpus}")
    cp = options.get("cp", 1)
    if cp < 1 or gpus % cp:
        raise SimparError(f"--cp: must be at least 1 and divide the {gpus} GPUs, got {cp}")
    dp, pp, tp = resolve_degrees(name, gpus // cp, dp, pp, tp)
    spec = StrategySpec(name=name, dp=dp, pp=pp, tp=tp, **options)
    _check_model_split(model, spec)
    if microbatches is not None and microbatches < 1:
        raise SimparError(f"--microbatches: must be at least 1, got {microbatches}")
    if global_batch is None:
        global_batch = micro_batch * dp * (microbatches or (4 * pp if pp > 1 else 1))
    elif microbatches is not None and global_batch != micro_batch * dp * microbatches:
        raise SimparError(f"--global-batch: {global_batch} disagrees with micro-batch {micro_batch} x dp {dp} x "
                          f"microbatches {microbatches} = {micro_batch * dp * microbatches}; give one of them")
    train = TrainSpec(global_batch=global_batch, micro_batch=micro_batch, precision=precision, optimizer=optimizer)
    for flag, on in (("--overlap-grad-reduce", spec.overlap_grad_reduce),
                     ("--overlap-param-gather", spec.overlap_param_gather),
                     ("--tp-comm-userbuffers", spec.tp_comm_userbuffers)):
        if on and name not in MODEL_PARALLEL:
            raise SimparError(f"{flag}: Megatron-Core's overlap, for its layouts: use --strategy 3d (pp, tp)")
    if spec.tp_comm_userbuffers and not (spec.sequence_parallel and spec.tp > 1):
        raise SimparError("--tp-comm-userbuffers: Transformer Engine's userbuffers overlap sequence-parallel "
                          "collectives; add --sequence-parallel with --tp 2 or more")
    if spec.tp_comm_userbuffers and spec.cp > 1:
        raise SimparError("--tp-comm-userbuffers: not modelled together with --cp (the attention piece holds "
                          "the context-parallel exchanges); drop one of the two")
    if train.fp8 and (name not in MODEL_PARALLEL or model.experts):
        raise SimparError("--precision: fp8-mixed is Transformer Engine's, in Megatron's layouts of dense models: use "
                          "--strategy 3d (pp, tp) without MoE layers, or bf16-mixed")
    scenario = Scenario(model, train, spec, ClusterSpec(topology, gpus, bandwidth, latency, device))
    if spec.zeropp_hpz and scenario.node_gpus % spec.zeropp_hpz:
        raise SimparError(f"--zeropp-hpz: a secondary partition of {spec.zeropp_hpz} ranks does not divide the "
                          f"node's {scenario.node_gpus} GPUs")
    m = scenario.microbatches  # checks that the batch splits evenly
    if spec.schedule == "interleaved" and pp > 1 and m % pp:
        raise SimparError(f"--microbatches: the interleaved schedule needs micro-batches ({m}) to be a "
                          f"multiple of pp ({pp})")
    return scenario


def _check_zero_bubble(model: ModelSpec, spec: StrategySpec) -> None:
    """Zero-bubble schedules split a pipeline's dense layers' backward into input and weight gradients."""
    if spec.pp < 2:
        raise SimparError(f"--schedule: {spec.schedule} fills a pipeline's bubbles; it needs --pp 2 or more "
                          f"(got pp {spec.pp})")
    if model.experts:
        raise SimparError(f"--schedule: {spec.schedule} splits dense layers' backward; {model.name}'s MoE layers "
                          f"are not split into B and W (use 1f1b or interleaved)")
    if spec.tp_comm_overlap:
        raise SimparError(f"--tp-comm-overlap: {spec.schedule} already moves the weight-gradient GEMMs to W; "
                          f"drop one of the two")


def _check_model_split(model: ModelSpec, spec: StrategySpec) -> None:
    if spec.schedule not in SCHEDULES:
        raise SimparError(f"--schedule: must be one of {', '.join(SCHEDULES)}, got {spec.schedule!r}")
    if spec.recompute not in RECOMPUTE:
        raise SimparError(f"--recompute: must be one of {', '.join(RECOMPUTE)}, got {spec.recompute!r}")
    if spec.virtual_stages < 1:
        raise SimparError(f"--virtual-stages: must be at least 1, got {spec.virtual_stages}")
    if spec.virtual_stages > 1 and spec.schedule != "interleaved":
        raise SimparError("--virtual-stages: only the interleaved schedule has virtual stages "
                          "(add --schedule interleaved)")
    if spec.schedule.startswith("zb-"):
        _check_zero_bubble(model, spec)
    if spec.grad_accum_dtype is not None and spec.grad_accum_dtype not in GRAD_DTYPES:
        raise SimparError(f"--grad-accum-dtype: must be one of {', '.join(GRAD_DTYPES)}, got {spec.grad_accum_dtype!r}")
    if spec.gather_granularity not in (None, *GRANULARITIES):
        raise SimparError(f"--gather-granularity: must be one of {', '.join(GRANULARITIES)}, "
                          f"got {spec.gather_granularity!r}")
    if spec.gather_granularity == "module" and spec.name != "zero3":
        raise SimparError(f"--gather-granularity: module applies to --strategy zero3 ({spec.name} "
                          f"{'moves and gathers whole layers' if spec.name.startswith('zero3') else 'gathers nothing'})")
    if spec.offload_params and spec.name != "zero3-offload":
        raise SimparError(f"--deepspeed: offload_param (parameter shards in host memory) needs ZeRO-3 with the "
                          f"optimizer offloaded too (zero3-offload), not {spec.name}")
    if spec.max_reuse_distance < 0:
        raise SimparError(f"--max-reuse-distance: must be 0 or more, got {spec.max_reuse_distance}")
    if spec.sequence_parallel and spec.name not in ("tp", "3d"):
        raise SimparError(f"--sequence-parallel: splits tensor-parallel layers; use --strategy tp or 3d, "
                          f"not {spec.name}")
    if spec.sequence_parallel and model.seq // spec.cp % spec.tp:
        raise SimparError(f"--sequence-parallel: sequence length {model.seq} (over cp {spec.cp}) is not divisible "
                          f"by tp {spec.tp}")
    from simpar.strategies.context import check_context

    check_context(model, spec)
    if spec.prefetch < 0:
        raise SimparError(f"--prefetch: must be 0 or more, got {spec.prefetch}")
    if spec.bucket_bytes < 1:
        raise SimparError(f"--bucket: must be positive, got {spec.bucket_bytes}")
    from simpar.strategies.layout import check_layout

    check_layout(model, spec)
    chunks = spec.pp * spec.chunks
    if model.layers % chunks:
        raise SimparError(f"--pp: {model.name} has {model.layers} layers, which do not split evenly over "
                          f"pp {spec.pp} x {spec.chunks} chunks a stage = {chunks}")
    for what, count in (("heads", model.heads), ("kv heads", model.n_kv_heads), ("ffn size", model.ffn)):
        if count % spec.tp:
            raise SimparError(f"--tp: {model.name} has {count} {what}, not divisible by tp {spec.tp}")
