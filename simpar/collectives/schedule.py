"""What a collective expands into: phases of concurrent point-to-point transfers.

A collective algorithm is a function from (group, bytes) to a list of ``Phase``s. Transfers in
a phase run at once (sharing links); a phase starts when the previous one has finished. The
simulator prices the phases on a topology; the executor can perform the same sends for real.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """``nbytes`` from ``src`` to ``dst`` (topology node names).

    ``steps`` > 1 means the transfer stands for that many lock-step messages (a ring's N-1
    steps, a pipeline's fill): the route latency is paid once per step.
    """

    src: str
    dst: str
    nbytes: int
    steps: int = 1


@dataclass(frozen=True)
class Phase:
    name: str
    transfers: tuple[Transfer, ...]


def chunk_sizes(nbytes: int, parts: int) -> list[int]:
    """Split ``nbytes`` into ``parts`` whole chunks, the first ones one byte larger if uneven
    (the rule of ``torch.tensor_split``)."""
    base, extra = divmod(int(nbytes), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def merge_phases(*schedules: list[Phase]) -> list[Phase]:
    """Run several schedules side by side: their i-th phases become one concurrent phase."""
    merged = []
    for i in range(max((len(s) for s in schedules), default=0)):
        parts = [s[i] for s in schedules if i < len(s)]
        merged.append(Phase(parts[0].name, tuple(t for p in parts for t in p.transfers)))
    return merged


def drop_empty(phases: list[Phase]) -> list[Phase]:
    return [p for p in phases if p.transfers]
