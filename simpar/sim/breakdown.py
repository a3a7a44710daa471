"""Where a rank's step time went: compute, exposed communication, pipeline bubble, offload, idle.

The GPU's compute stream is either busy (compute) or waiting. Each wait is explained by walking
back along what the waiting op depended on: the interval an op spent running is charged to its
kind (a collective or send: communication; a copy or the CPU step: offload), and the time before
it started is explained, in turn, by its own last dependency or its stream predecessor. Waiting
for a pipeline receive whose sender had not started yet is the bubble. The parts add up to the
step time exactly.
"""

from __future__ import annotations

from collections import defaultdict

from simpar.plan import Collective, Compute, Copy, Recv, Send

PARTS = ("compute", "communication", "bubble", "offload", "idle")


def part_of(op) -> str | None:
    if isinstance(op, (Collective, Send)):
        return "communication"
    if isinstance(op, Copy) or (isinstance(op, Compute) and op.device == "host"):
        return "offload"
    if isinstance(op, Compute):
        return "compute"
    return None  # Alloc / Free take no time


def program_breakdown(sim, pi: int, step_time: float) -> dict[str, float]:
    prog, times = sim.plan.programs[pi], sim.times[pi]
    parts: dict[str, float] = defaultdict(float)
    previous_on_stream: dict[int, int] = {}
    last_seen: dict[str, int] = {}
    for op in prog.ops:
        if op.stream in last_seen:
            previous_on_stream[op.id] = last_seen[op.stream]
        last_seen[op.stream] = op.id

    def explain(op_id: int, t0: float, t1: float) -> None:
        """Charge [t0, t1], which ends no later than op ``op_id`` does, to what caused it."""
        stack = [(op_id, t0, t1)]
        while stack:
            op_id, t0, t1 = stack.pop()
            if t1 <= t0:
                continue
            op = prog.ops[op_id]
            ready, start, end = times[op_id]
            t1 = min(t1, end)
            if isinstance(op, Recv):  # waiting for data: bubble until the sender sent, then transfer
                issued = min(max(sim.send_issued.get(op.tag, start), max(start, t0)), t1)
                parts["bubble"] += issued - max(start, t0)
                parts["communication"] += t1 - issued
            elif (part := part_of(op)) is not None:
                parts[part] += max(0.0, t1 - max(start, t0))
            if start <= t0:
                continue
            waited_from = max(ready, t0)
            if start > waited_from:
                if op.deps:
                    stack.append((max(op.deps, key=lambda d: times[d][2]), waited_from, start))
                else:
                    parts["idle"] += start - waited_from
            if ready > t0:
                if op_id in previous_on_stream:
                    stack.append((previous_on_stream[op_id], t0, ready))
                else:
                    parts["idle"] += ready - t0

    cursor = 0.0
    for op in prog.stream("compute"):
        _, start, end = times[op.id]
        if isinstance(op, Compute):
            if start > cursor:
                explain(op.id, cursor, start)
            parts["compute"] += end - start
            cursor = end
    finish = max(end for _, _, end in times)
    if finish > cursor:
        last = max(range(len(prog.ops)), key=lambda i: times[i][2])
        explain(last, cursor, finish)
    parts["bubble" if sim.plan.grid.pp > 1 else "idle"] += step_time - max(finish, cursor)
    return {part: parts[part] for part in PARTS}
