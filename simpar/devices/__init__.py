"""Devices: GPUs, CPU hosts and NVMe drives as frozen datasheet specs."""

from simpar.devices.presets import GPUS, HOSTS, NVMES, gpu, host, nvme
from simpar.devices.specs import DTYPES, GPUSpec, HostSpec, NVMeSpec

__all__ = ["DTYPES", "GPUS", "HOSTS", "NVMES", "GPUSpec", "HostSpec", "NVMeSpec",
           "gpu", "host", "nvme"]
