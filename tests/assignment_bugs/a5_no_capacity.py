"""Planted bug: tokens past the capacity overwrite the last slot instead of being dropped."""
from instructor.solutions.a5 import all_to_all, alltoall_schedule, combine  # noqa: F401


def dispatch_buffer(tokens, expert, experts, capacity):
    import torch

    buffer = tokens.new_zeros(experts, capacity, tokens.shape[1])
    slot = torch.zeros(tokens.shape[0], dtype=torch.long)
    used = [0] * experts
    for t, e in enumerate(expert.tolist()):
        s = min(used[e], capacity - 1)
        buffer[e, s] = tokens[t]
        slot[t] = s
        used[e] += 1
    return buffer, slot
