"""Pipeline schedules: the order in which one stage runs forward (F) and backward (B) passes.

A schedule is, per stage, a list of (pass, micro-batch, chunk). ``chunk`` is the model chunk
of the stage (always 0 without interleaving); virtual stage = chunk * p + stage.

- GPipe: all m forwards, then all m backwards; a stage holds m micro-batches of activations.
- 1F1B (PipeDream-Flush): p - s - 1 warm-up forwards, then one forward and one backward in
  turn, then the remaining backwards; stage s holds at most p - s micro-batches.
- Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): each stage holds v chunks, visited in
  groups of p micro-batches, which divides the bubble by v at the cost of v times more p2p.
With equal stage times and free communication all three leave a bubble of (p-1)/(v·m + p-1).
"""

from __future__ import annotations

Pass = tuple[str, int, int]  # ("F" | "B", micro-batch, chunk)


def gpipe(stage: int, stages: int, m: int, chunks: int = 1) -> list[Pass]:
    return [("F", mb, 0) for mb in range(m)] + [("B", mb, 0) for mb in range(m)]


def one_f_one_b(stage: int, stages: int, m: int, chunks: int = 1) -> list[Pass]:
    warmup = min(stages - stage - 1, m)
    order = [("F", mb, 0) for mb in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i, 0), ("B", i, 0)]
    return order + [("B", mb, 0) for mb in range(m - warmup, m)]


def interleaved(stage: int, stages: int, m: int, chunks: int) -> list[Pass]:
    p, v = stages, chunks
    if v == 1:
        return one_f_one_b(stage, stages, m)
    total = m * v

    def forward(k: int) -> Pass:
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k: int) -> Pass:
        return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [forward(warmup + i), backward(i)]
    return order + [backward(k) for k in range(total - warmup, total)]


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved}
