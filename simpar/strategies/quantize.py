"""The sizes ZeRO++ quantization gives a tensor on the wire (Wang et al. 2023): blocks of
``BLOCK`` elements, each with an fp32 scale, int8 values for weights (qwZ) and int4 for gradients
(qgZ, two a byte). Each rank quantizes its own chunk (``torch.tensor_split`` of the tensor over
the group), so a collective's bytes are the sum of its chunks'. real/quantize.py performs it.
"""

from __future__ import annotations

from simpar.collectives.schedule import chunk_sizes

BLOCK = 2048
BITS = {"int8": 8, "int4": 4}


def quantized_bytes(numel: int, dtype: str) -> int:
    """One chunk of ``numel`` elements quantized: its values, then one fp32 scale per block."""
    blocks = -(-numel // BLOCK)
    return -(-numel * BITS[dtype] // 8) + 4 * blocks


def collective_bytes(numel: int, n: int, dtype: str) -> int:
    """A tensor of ``numel`` elements, each of the n ranks' chunks quantized on its own."""
    return sum(quantized_bytes(c, dtype) for c in chunk_sizes(numel, n))
