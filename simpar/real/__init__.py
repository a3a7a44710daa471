"""The reference executor: real runs with torch.distributed (gloo on CPU, NCCL on GPUs)."""
