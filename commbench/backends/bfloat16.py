"""bfloat16 held as its 16 bits in uint16 arrays: NumPy and CuPy have no bfloat16 dtype, so the shm and
CuPy-based backends store it so, rounding to nearest even on the way in and widening exactly on the way out."""
from __future__ import annotations

import numpy as np


def to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def from_float32(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits, to nearest even (NaN stays NaN)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    one, half = np.uint32(1), np.uint32(0x7FFF)
    rounded = ((bits + half + ((bits >> np.uint32(16)) & one)) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)
