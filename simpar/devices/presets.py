"""Datasheet presets. Dense (non-sparse) tensor-core peaks; memory in bytes.

Capacities are the marketed size in GiB (what ``torch.cuda.get_device_properties`` roughly
reports) except H200, whose datasheet gives 141 GB. The achievable fraction is a typical
large-GEMM efficiency; ``simpar calibrate`` measures the real one.
"""

from __future__ import annotations

import dataclasses

from simpar.costs.gpu import KernelModel
from simpar.devices.specs import GPUSpec, HostSpec, NVMeSpec
from simpar.errors import SimparError

GiB = 2**30
TB = 10**12
T = 1e12

# How large GEMMs, streaming kernels and kernel launches fare, per device class (costs/gpu.py).
# The efficiencies and the overhead are one fit of the whole model over the published measurements the
# project was given (validation/published.json, sets A and B: Megatron-LM on DGX A100); SM counts
# are the whitepapers'. GPUs without published training measurements at hand take the A100's fit.
GEMM_EFFICIENCY = 0.70
HBM_EFFICIENCY = 0.75
KERNEL_OVERHEAD = 4e-6
_FIT = "efficiencies and overhead: simpar's fit to Megatron-LM on A100 (validation/published.json)"
# Hopper (GH100: H100, H200) in training: the one constant refitted over the nine Megatron-Core H100 runs of
# set D (mean |error| least at 0.62). Isolated GEMMs reach 0.708 of the datasheet peak (the committed H100
# profile); a whole step holds the 700 W part at its power limit, where the SM clock sits below the boost
# clock the peak is quoted at (the A100 fit likewise sits under isolated A100 GEMMs).
HOPPER_GEMM_EFFICIENCY = 0.62
_HOPPER_FIT = ("GEMM efficiency: simpar's fit to Megatron-Core on H100 (validation/published.json, set D); "
               "HBM efficiency and overhead: the A100 fit")


def _kernels(name: str) -> KernelModel:
    if name in ("h100-sxm", "h200"):
        return KernelModel(SMS[name], HOPPER_GEMM_EFFICIENCY, HBM_EFFICIENCY, KERNEL_OVERHEAD, source=_HOPPER_FIT)
    return KernelModel(SMS[name], GEMM_EFFICIENCY, HBM_EFFICIENCY, KERNEL_OVERHEAD, source=_FIT)


SMS = {"v100-32gb": 80, "a100-40gb": 108, "a100-80gb": 108, "h100-sxm": 132, "h200": 132, "rtx-3090": 82,
       "rtx-4090": 128, "b200": 148, "gb200": 148}
# NVIDIA Volta, Ampere (GA100, GA102), Hopper (GH100 SXM5) and Ada (AD102) whitepapers; Blackwell: two dies of
# 74 enabled SMs (Chips and Cheese, "Nvidia's B200")

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("v100-32gb", 15.7 * T, None, 125 * T, None, 0.7, 32 * GiB, 900e9,
                "NVIDIA V100 SXM2 datasheet (no TF32 or bf16 tensor cores)"),
        GPUSpec("a100-40gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 0.7, 40 * GiB, 1555e9,
                "NVIDIA A100 SXM4 40GB datasheet"),
        GPUSpec("a100-80gb", 19.5 * T, 156 * T, 312 * T, 312 * T, 0.7, 80 * GiB, 2039e9,
                "NVIDIA A100 SXM4 80GB datasheet"),
        GPUSpec("h100-sxm", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 0.7, 80 * GiB, 3.35e12,
                "NVIDIA H100 SXM5 datasheet (dense = half the sparse figure)", fp8_flops=1978.9 * T),
        GPUSpec("h200", 67 * T, 494.7 * T, 989.4 * T, 989.4 * T, 0.7, 141 * 10**9, 4.8e12,
                "NVIDIA H200 SXM datasheet", fp8_flops=1978.9 * T),
        GPUSpec("b200", 75 * T, 1125 * T, 2250 * T, 2250 * T, 0.7, 180 * 10**9, 8e12,
                "NVIDIA HGX B200 / DGX B200 datasheets, per GPU (dense = half the sparse figure)", fp8_flops=4500 * T),
        GPUSpec("gb200", 90 * T, 1250 * T, 2500 * T, 2500 * T, 0.7, 186 * 10**9, 8e12,
                "NVIDIA GB200 NVL72 datasheet, per GPU: rack figures / 72 (dense = half the sparse figure)",
                fp8_flops=5000 * T),
        GPUSpec("rtx-3090", 35.6 * T, 35.6 * T, 71 * T, 71 * T, 0.7, 24 * GiB, 936e9,
                "NVIDIA Ampere GA102 whitepaper (fp16 tensor with fp32 accumulate)"),
        GPUSpec("rtx-4090", 82.6 * T, 82.6 * T, 165.2 * T, 165.2 * T, 0.7, 24 * GiB, 1008e9,
                "NVIDIA Ada AD102 whitepaper (fp16 tensor with fp32 accumulate)"),
    ]
}
GPUS = {name: dataclasses.replace(spec, kernels=_kernels(name)) for name, spec in GPUS.items()}

HOSTS: dict[str, HostSpec] = {
    h.name: h
    for h in [
        # DGX A100: 2x AMD EPYC 7742 (64 cores each), 8 channels DDR4-3200 per socket.
        HostSpec("epyc-7742x2", 128, 1024 * GiB, 409.6e9, 4.6 * T, 4e9,
                 "DGX A100 user guide; CPU-Adam rate after the ZeRO-Offload paper"),
        # DGX H100: 2x Intel Xeon Platinum 8480C (56 cores each), 8 channels DDR5-4800 per socket.
        HostSpec("xeon-8480x2", 112, 2048 * GiB, 614e9, 8.6 * T, 5e9,
                 "DGX H100 user guide; CPU-Adam rate scaled from ZeRO-Offload"),
        # DGX B200: 2x Intel Xeon Platinum 8570 (56 cores each), 8 channels DDR5-5600 per socket.
        HostSpec("xeon-8570x2", 112, 2048 * GiB, 717e9, 8.6 * T, 5e9,
                 "DGX B200 user guide; CPU-Adam rate as the DGX H100's (same core count)"),
        # GB200 NVL72: 36 Grace CPUs (72 Arm Neoverse V2 cores, 480 GB LPDDR5X at 512 GB/s each) as one host
        # per rack (simpar's node is the NVLink domain); reached over NVLink-C2C, not PCIe
        HostSpec("grace-nvl72", 36 * 72, 36 * 480 * 10**9, 36 * 512e9, 36 * 3.5 * T, 36 * 3.2e9,
                 "NVIDIA GB200 NVL72 and Grace CPU datasheets; CPU-Adam rate scaled by cores from ZeRO-Offload"),
        # A workstation: 32-core Threadripper 3970X, 4 channels DDR4-3200.
        HostSpec("threadripper-3970x", 32, 256 * GiB, 102.4e9, 3.6 * T, 1.5e9,
                 "AMD Threadripper 3970X spec sheet; CPU-Adam rate scaled by cores"),
    ]
}

NVMES: dict[str, NVMeSpec] = {
    n.name: n
    for n in [
        NVMeSpec("nvme-gen4", 4 * TB, 7.0e9, 5.0e9, "a typical PCIe 4.0 x4 data-centre drive"),
        NVMeSpec("nvme-raid-dgx", 15 * TB, 24e9, 16e9,
                 "DGX A100 internal 4x 3.84 TB U.2 in RAID-0 (four single-drive figures)"),
    ]
}

KINDS = {"gpu": GPUS, "host": HOSTS, "nvme": NVMES}


def _lookup(table: dict, kind: str, name: str):
    key = name.strip().lower()
    if key not in table:
        raise SimparError(f"{kind}: unknown preset {name!r}; choose from {', '.join(table)}")
    return table[key]


def gpu(name: str) -> GPUSpec:
    return _lookup(GPUS, "--device", name)


def host(name: str) -> HostSpec:
    return _lookup(HOSTS, "--host", name)


def nvme(name: str) -> NVMeSpec:
    return _lookup(NVMES, "--nvme", name)
