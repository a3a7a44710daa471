"""simpar: simulate, really run, and teach distributed deep-learning training."""

from simpar.errors import SimparError

__all__ = ["SimparError"]
__version__ = "0.1.0"
