"""fp8 flavours: the same byte decodes to different values on NVIDIA/gfx950 and on gfx942."""

from __future__ import annotations

import torch

from difftest.core.errors import SpecError
from difftest.core.kinds import Fp8Flavour

# Largest magnitude representable in both flavours, so a case converts between them exactly.
COMMON_MAX = 240.0


def decode(raw: torch.Tensor, flavour: Fp8Flavour, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Values of fp8 bytes (uint8) in `flavour`, as `dtype`."""
    return raw.view(flavour.dtype).to(dtype)


def encode_exact(values: torch.Tensor, flavour: Fp8Flavour, field: str) -> torch.Tensor:
    """uint8 bytes of `values` in `flavour`; SpecError if any finite value is not representable."""
    raw = values.to(flavour.dtype).view(torch.uint8)
    finite = torch.isfinite(values)
    back = decode(raw, flavour, values.dtype)
    if not torch.equal(back[finite], values[finite]):
        bad = values[finite][back[finite] != values[finite]][0].item()
        raise SpecError(field, bad, f"a value representable exactly in {flavour.value}")
    return raw


def convert(raw: torch.Tensor, source: Fp8Flavour, target: Fp8Flavour, field: str) -> torch.Tensor:
    """Re-encode fp8 bytes from one flavour into another, keeping every value (NaN stays NaN)."""
    if source == target:
        return raw
    values = decode(raw, source, torch.float32)
    out = encode_exact(values, target, field)
    return torch.where(torch.isnan(values), torch.full_like(out, target.nan_byte), out)


def nan_bytes(raw: torch.Tensor, flavour: Fp8Flavour) -> torch.Tensor:
    """bool, raw's shape: the bytes that decode to NaN in `flavour` (e4m3fn: 0x7F and 0xFF; e4m3fnuz: 0x80),
    read without decoding (a 2^31-byte key buffer would decode to 8 GB of float32)."""
    if flavour == Fp8Flavour.E4M3FNUZ:
        return raw == 0x80
    return (raw & 0x7F) == 0x7F
