"""ZeRO++'s block quantization performed for real (strategies/quantize.py gives the sizes): each block of
``BLOCK`` elements scaled by its largest magnitude into int8 (qwZ's weights) or int4 (qgZ's gradients, two
a byte), its fp32 scale sent after the values, all as one byte tensor."""

from __future__ import annotations

import torch

from simpar.strategies.quantize import BLOCK, quantized_bytes

LEVELS = {"int8": 127, "int4": 7}


def quantize(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """``x`` (1-d) as quantized_bytes(x.numel(), dtype) bytes."""
    numel, levels = x.numel(), LEVELS[dtype]
    blocks = -(-numel // BLOCK)
    padded = torch.zeros(blocks * BLOCK, dtype=torch.float32, device=x.device)
    padded[:numel] = x.detach().float()
    padded = padded.view(blocks, BLOCK)
    scale = padded.abs().amax(dim=1).clamp(min=1e-30) / levels
    q = torch.round(padded / scale[:, None]).clamp(-levels, levels).to(torch.int16).reshape(-1)[:numel]
    if dtype == "int8":
        values = q.to(torch.int8).view(torch.uint8)
    else:  # two 4-bit codes (value + 8) a byte, low nibble first
        codes = (q + 8).to(torch.uint8)
        if numel % 2:
            codes = torch.cat([codes, codes.new_zeros(1)])
        values = codes[0::2] | (codes[1::2] << 4)
    packed = torch.cat([values, scale.view(torch.uint8)])
    assert packed.numel() == quantized_bytes(numel, dtype)
    return packed


def dequantize(packed: torch.Tensor, numel: int, dtype: str, out_dtype=torch.float32) -> torch.Tensor:
    blocks = -(-numel // BLOCK)
    nvalues = packed.numel() - 4 * blocks
    scale = packed[nvalues:].clone().view(torch.float32)
    if dtype == "int8":
        q = packed[:nvalues].view(torch.int8).float()
    else:
        codes = torch.stack([packed[:nvalues] & 15, packed[:nvalues] >> 4], dim=1).reshape(-1)[:numel]
        q = codes.float() - 8
    padded = torch.zeros(blocks * BLOCK, device=packed.device)
    padded[:numel] = q
    return (padded.view(blocks, BLOCK) * scale[:, None]).reshape(-1)[:numel].to(out_dtype)
