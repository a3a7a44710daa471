"""Reading and writing quantities: "1e9", "256MiB", "100GB" and friends."""

from __future__ import annotations

import math
import re

from simpar.errors import SimparError

_SUFFIXES = {
    "": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50,
}
_QUANTITY = re.compile(r"^\s*([0-9.eE+-]+)\s*([kmgtpKMGTP]i?)?\s*(?:[bB](?:/s|ps)?)?\s*$")


def parse_quantity(text: str | float | int, field: str) -> float:
    """Parse a number with an optional SI (k, M, G) or binary (Ki, Mi, Gi) multiplier.

    A trailing "B" or "B/s" is allowed so that "256MiB" and "100GB/s" both read naturally.
    """
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _QUANTITY.match(str(text))
        if not match:
            raise SimparError(f"{field}: cannot read {text!r} as a number (examples: 1e9, 256MiB, 100GB/s)")
        try:
            number = float(match.group(1))
        except ValueError:
            raise SimparError(f"{field}: cannot read {text!r} as a number (examples: 1e9, 256MiB, 100GB/s)") from None
        value = number * _SUFFIXES[(match.group(2) or "").lower()]
    if not math.isfinite(value):
        raise SimparError(f"{field}: {text!r} is not a finite number")
    return value


def positive(text: str | float, field: str) -> float:
    value = parse_quantity(text, field)
    if value <= 0:
        raise SimparError(f"{field}: must be positive, got {text!r}")
    return value


def non_negative(text: str | float, field: str) -> float:
    value = parse_quantity(text, field)
    if value < 0:
        raise SimparError(f"{field}: must not be negative, got {text!r}")
    return value


def whole_bytes(text: str | float | int, field: str) -> int:
    """A positive whole number of bytes ("1e9" and "1GiB" are fine, "0.5" is not)."""
    value = positive(text, field)
    if value != int(value):
        raise SimparError(f"{field}: must be a whole number of bytes, got {text!r}")
    return int(value)


def positive_int(text: str | int, field: str, minimum: int = 1) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise SimparError(f"{field}: expected a whole number, got {text!r}") from None
    if value < minimum:
        raise SimparError(f"{field}: must be at least {minimum}, got {value}")
    return value


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'. Binary units, as memory is usually reported."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1000 or unit == "PiB":  # (1000-1023 go up a unit: 0.999 GiB, never 1.02e+03 MiB)
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_rate(bytes_per_s: float) -> str:
    """Bandwidth in decimal GB/s, the unit datasheets and nccl-tests use."""
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def human_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.4g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} us"
