"""Model and hardware FLOPs of a training step, as Megatron-LM and DeepSpeed logs report them.

Model FLOPs count one forward (2 per multiply-add of every weight matrix, plus attention's QK^T and
AV in full) and a backward of twice that, whatever the implementation recomputes:
    3 · B · (L · (2·s·P_layer + 4·s²·h) + 2·s·V·h)
with P_layer the layer's weight-matrix elements (an MoE layer's: attention, router, and the top_k routed
and the shared experts a token runs through); for a GPT with a 4h GELU MLP this is Narayanan et
al.'s 72·B·s·L·h²·(1 + s/6h + V/12hL), and it holds as written for GQA and SwiGLU. Hardware FLOPs
add what recomputation runs again: the layers' forward (full) or attention's QK^T and AV
(selective). MFU / HFU divide the per-GPU rate by the dtype's dense peak.
"""

from __future__ import annotations

from simpar.scenario import Scenario


def model_flops(scenario: Scenario) -> float:
    m, batch = scenario.model, scenario.train.global_batch
    return 3.0 * batch * (m.layers_forward_flops(1) + m.head_forward_flops(1))


def hardware_flops(scenario: Scenario) -> float:
    m, batch, recompute = scenario.model, scenario.train.global_batch, scenario.strategy.recompute
    extra = {"none": 0.0, "full": m.layers_forward_flops(1), "selective": 4.0 * m.seq**2 * m.hidden * m.layers}
    return model_flops(scenario) + batch * extra[recompute]


def utilisation(scenario: Scenario, step_time: float, topology) -> dict:
    """Per GPU, against the dense peak of ``topology``'s GPU in the training's compute dtype (fp8-mixed: bf16's,
    and as ``mfu_fp8`` against the FP8 peak)."""
    gpu = topology.graph.nodes[topology.gpus[0]]["spec"]
    peak = gpu.peak_flops(scenario.train.compute_dtype)
    gpus = scenario.cluster.gpus
    per_gpu = model_flops(scenario) / (step_time * gpus)
    out = {"model_flops_per_gpu_s": per_gpu, "mfu": per_gpu / peak,
           "hfu": hardware_flops(scenario) / (step_time * gpus) / peak}
    if scenario.train.fp8:  # (mfu stays against bf16's peak, as Megatron-LM and Transformer Engine report it)
        out["mfu_fp8"] = per_gpu / gpu.peak_flops("fp8")
    return out
