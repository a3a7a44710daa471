"""What the executor performs: anything else is one clear error naming the flag, before any rank starts."""

from __future__ import annotations

from simpar.errors import SimparError
from simpar.real.experts import check_moe_supported
from simpar.scenario import Scenario


def check_supported(scenario: Scenario) -> None:
    """What the executor cannot perform yet, as one clear error naming the flag."""
    spec = scenario.strategy
    if spec.pp > 1 and scenario.model.tied_embeddings:
        raise SimparError(f"--model: {scenario.model.name} ties its embedding and head, which the executor "
                          "cannot split across pipeline stages yet; use an untied model")
    if spec.tp > 1 and scenario.model.vocab % spec.tp:
        raise SimparError(f"--tp: the executor splits {scenario.model.name}'s vocabulary of {scenario.model.vocab} "
                          f"evenly, which tp {spec.tp} does not divide")
    if scenario.train.precision == "fp16-mixed":
        raise SimparError("--precision: fp16 needs loss scaling, which the executor does not do; use bf16-mixed "
                          "or fp32")
    if spec.overlap_param_gather:
        raise SimparError("--overlap-param-gather: the executor gathers the parameters after the step, not ahead of "
                          "the next; leave it out with --compare-real")
    if scenario.train.fp8:
        raise SimparError("--precision: the executor does not run FP8 (Transformer Engine's kernels need Hopper "
                          "or later); use bf16-mixed")
    if scenario.train.mixed and spec.name == "zero3-infinity":
        raise SimparError("--precision: the executor runs zero3-infinity in fp32 only")
    if spec.algo not in (None, "ring", "ps"):
        raise SimparError(f"--algo: the executor performs ring and ps (Worker-Server) collectives, not {spec.algo}")
    if spec.sequence_parallel and scenario.model.seq % spec.tp:
        raise SimparError(f"--sequence-parallel: the executor splits {scenario.model.name}'s sequence of "
                          f"{scenario.model.seq} evenly over the TP ranks, which tp {spec.tp} does not divide")
    if spec.tp_comm_overlap:
        raise SimparError("--tp-comm-overlap: the executor runs ops one at a time; leave it out with --compare-real")
    if spec.offload_params or (spec.param_persistence_threshold and scenario.gather_granularity == "module"):
        raise SimparError("--deepspeed: offload_param and persistent ZeRO-3 parameters are DeepSpeed's habits, "
                          "simulated but not performed by simpar's executor")
    if scenario.grad_bytes != scenario.train.weight_bytes:
        raise SimparError(f"--grad-accum-dtype: the executor keeps gradients in the weights' dtype, not "
                          f"{spec.grad_accum_dtype}")
    if spec.recompute == "selective" or (spec.recompute == "full" and spec.tp > 1):
        raise SimparError("--recompute: the executor recomputes whole layers (full) without tensor parallelism "
                          "only")
    if spec.cp > 1 and spec.tp > 1:
        raise SimparError("--cp: the executor performs context parallelism without tensor parallelism only; leave "
                          "out --tp")
    if spec.schedule.startswith("zb-") and spec.tp > 1:
        raise SimparError(f"--schedule: the executor performs {spec.schedule} without tensor parallelism only "
                          f"(its tensor-parallel pieces are not split into B and W); leave out --tp")
    check_moe_supported(scenario)
