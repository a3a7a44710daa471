"""What an op costs on a device: the kernels a unit of work launches (kernels.py), what one kernel
costs on a GPU (gpu.py: GEMM efficiency by shape, memory-bound kernels at achievable HBM bandwidth,
launch overhead), and what a collective costs under NCCL's protocols (nccl.py). The simulator asks
here; Plan ops keep their meaning and never carry a time."""
