"""Planted bug: every step sends to the right neighbour (a ring), so pairs repeat and most never meet."""
from instructor.solutions.a5 import all_to_all, combine, dispatch_buffer  # noqa: F401


def alltoall_schedule(world, nbytes):
    base, extra = divmod(nbytes, world)
    sizes = [base + (1 if j < extra else 0) for j in range(world)]
    return [[(i, (i + 1) % world, sizes[(i + 1) % world]) for i in range(world)] for _ in range(1, world)]
