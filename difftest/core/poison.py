"""The NaN sentinel output buffers are pre-filled with, so unwritten positions can be told from NaN."""

from __future__ import annotations

import torch

# Quiet NaNs with a payload no arithmetic produces (a computed NaN is 0x7FC00000 or its sign twin).
POISON_BITS = {torch.float32: (0x7FC0DEAD, torch.int32), torch.bfloat16: (0x7FDE, torch.int16),
                torch.float16: (0x7EAD, torch.int16)}


INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-width integers


def bits(values: torch.Tensor) -> torch.Tensor:
    """The values as integers of the same width, so NaN payloads and -0.0 compare exactly."""
    return values.view(INT_OF_SIZE[values.element_size()]) if values.dtype.is_floating_point else values


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A [shape] buffer of `dtype` holding the poison NaN everywhere."""
    bits, int_dtype = POISON_BITS[dtype]
    return torch.full(shape, bits, dtype=int_dtype, device=device).view(dtype)


def is_poison(values: torch.Tensor) -> torch.Tensor:
    """Boolean mask of positions still holding the poison of values.dtype (all False for others)."""
    if values.dtype not in POISON_BITS:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    bits, int_dtype = POISON_BITS[values.dtype]
    return values.contiguous().view(int_dtype) == bits
