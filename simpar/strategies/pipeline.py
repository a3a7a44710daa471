"""Pipeline schedules: the order in which one stage runs forward (F) and backward (B) passes.

A schedule is, per stage, a list of (pass, micro-batch, chunk); ``times`` (a layer's F, B and W seconds, or
any multiple of them) only steers ZB-V. ``chunk`` is the model chunk
of the stage (always 0 without interleaving); virtual stage = chunk * p + stage.

- GPipe: all m forwards, then all m backwards; a stage holds m micro-batches of activations.
- 1F1B (PipeDream-Flush): p - s - 1 warm-up forwards, then one forward and one backward in
  turn, then the remaining backwards; stage s holds at most p - s micro-batches.
- Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): each stage holds v chunks, visited in
  groups of p micro-batches, which divides the bubble by v at the cost of v times more p2p.
With equal stage times and free communication all three leave a bubble of (p-1)/(v·m + p-1).

Zero-bubble schedules (Qi et al. 2023) split the backward into B, the input gradient (what the previous
stage waits for), and W, the weight gradient (which nothing waits for), and fill bubbles with W:
- ZB-H1: 1F1B's warm-up and in-flight micro-batches, but stage s defers its first s weight gradients
  to the tail, where it would otherwise wait; with T_W <= T_B each stage idles (p-1)(T_F + T_B - T_W)
  against 1F1B's (p-1)(T_F + T_B + T_W).
- ZB-V: two chunks a stage placed as a V (stage s holds virtual stages s and 2p-1-s, so the first and
  last virtual stages share stage 0 and a micro-batch turns round on stage p-1 without a send). Its
  order is found by list scheduling with the layers' F, B and W times (their FLOPs' ratio, as the
  paper's scheduler takes profiled times): a free stage runs a ready B, else a ready F while it holds
  fewer than 2p chunks' activations (1F1B's p micro-batches), else its oldest pending W. At equal times
  it idles the fill no schedule avoids ((p-1) chunk forwards on the last stage) and at most one chunk
  pass more; at unequal ones less than ZB-H1.
"""

from __future__ import annotations

from functools import lru_cache

Pass = tuple[str, int, int]  # ("F" | "B" | "W", micro-batch, chunk)
SPLIT_BACKWARD = ("zb-h1", "zb-v")  # schedules whose B is the input gradient alone, W the weight gradient


def gpipe(stage: int, stages: int, m: int, chunks: int = 1, times=None) -> list[Pass]:
    return [("F", mb, 0) for mb in range(m)] + [("B", mb, 0) for mb in range(m)]


def one_f_one_b(stage: int, stages: int, m: int, chunks: int = 1, times=None) -> list[Pass]:
    warmup = min(stages - stage - 1, m)
    order = [("F", mb, 0) for mb in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i, 0), ("B", i, 0)]
    return order + [("B", mb, 0) for mb in range(m - warmup, m)]


def interleaved(stage: int, stages: int, m: int, chunks: int, times=None) -> list[Pass]:
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


def zb_h1(stage: int, stages: int, m: int, chunks: int = 1, times=None) -> list[Pass]:
    warmup, deferred = min(stages - stage - 1, m), stage
    order = [("F", mb, 0) for mb in range(warmup)]
    pending: list[int] = []  # micro-batches whose B has run and W not yet

    def backward(mb: int) -> None:
        order.append(("B", mb, 0))
        pending.append(mb)
        if len(pending) > deferred:
            order.append(("W", pending.pop(0), 0))

    for i in range(m - warmup):
        order.append(("F", warmup + i, 0))
        backward(i)
    for mb in range(m - warmup, m):
        order.append(("B", mb, 0))
        pending.append(mb)
        order.append(("W", pending.pop(0), 0))
    return order + [("W", mb, 0) for mb in pending]


def v_virtual_stage(stage: int, chunk: int, stages: int) -> int:
    """ZB-V's placement: chunk 0 of stage s is virtual stage s, chunk 1 is 2p - 1 - s."""
    return stage if chunk == 0 else 2 * stages - 1 - stage


def v_stage(virtual_stage: int, stages: int) -> int:
    return virtual_stage if virtual_stage < stages else 2 * stages - 1 - virtual_stage


@lru_cache(maxsize=64)
def _zb_v_orders(p: int, m: int, times: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> tuple[tuple[Pass, ...], ...]:
    """Every stage's ZB-V order, by list scheduling with unit pass times (see the module's docstring)."""
    last, limit = 2 * p - 1, 2 * p
    done: dict[tuple[str, int, int], float] = {}  # (pass, virtual stage, micro-batch) -> finish time
    free_at, held = [0.0] * p, [0] * p
    next_f, next_b = [[0, 0] for _ in range(p)], [[0, 0] for _ in range(p)]
    pending: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    orders: list[list[Pass]] = [[] for _ in range(p)]
    for _ in range(6 * m * p):
        best = None
        for s in range(p):
            ready = []  # (start, priority, tie-break, pass, micro-batch, chunk)
            for chunk in (1, 0):
                vs = v_virtual_stage(s, chunk, p)
                mb = next_b[s][chunk]
                after = ("F", vs, mb) if vs == last else ("B", vs + 1, mb)
                if mb < m and after in done and ("F", vs, mb) in done:
                    ready.append((max(free_at[s], done[after]), 0, -vs, "B", mb, chunk))
                mb = next_f[s][chunk]
                after = ("F", vs - 1, mb)
                if mb < m and held[s] < limit and (vs == 0 or after in done):
                    ready.append((max(free_at[s], done.get(after, 0.0)), 1, -vs, "F", mb, chunk))
            if pending[s]:
                ready.append((free_at[s], 2, 0, "W", *pending[s][0]))
            if ready:
                start = min(r[0] for r in ready)
                pick = min((r for r in ready if r[0] <= start), key=lambda r: r[1:3])
                if best is None or pick[0] < best[1][0]:
                    best = (s, pick)
        s, (start, _, _, kind, mb, chunk) = best
        free_at[s] = start + times["FBW".index(kind)]
        done[(kind, v_virtual_stage(s, chunk, p), mb)] = free_at[s]
        orders[s].append((kind, mb, chunk))
        if kind == "F":
            next_f[s][chunk] += 1
            held[s] += 1
        elif kind == "B":
            next_b[s][chunk] += 1
            pending[s].append((mb, chunk))
        else:
            pending[s].pop(0)
            held[s] -= 1
    return tuple(tuple(order) for order in orders)


def zb_v(stage: int, stages: int, m: int, chunks: int = 2, times: tuple[float, float, float] = (1, 1, 1)) -> list[Pass]:
    return list(_zb_v_orders(stages, m, tuple(round(t / times[0], 2) for t in times))[stage])


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zb_h1, "zb-v": zb_v}


def virtual_stage(schedule: str, stage: int, chunk: int, stages: int) -> int:
    """The virtual stage (its place in the model) of a stage's chunk."""
    return v_virtual_stage(stage, chunk, stages) if schedule == "zb-v" else chunk * stages + stage


def stage_of(schedule: str, virtual: int, stages: int) -> int:
    return v_stage(virtual, stages) if schedule == "zb-v" else virtual % stages
