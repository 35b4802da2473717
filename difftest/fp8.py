"""fp8 flavours: the same byte decodes to different values on NVIDIA/gfx950 and on gfx942."""

from __future__ import annotations

import enum

import torch

from difftest.errors import SpecError


class Fp8Flavour(str, enum.Enum):
    """Which e4m3 encoding a byte is in. e4m3fnuz's exponent bias is one higher: half the value."""

    E4M3FN = "e4m3fn"
    E4M3FNUZ = "e4m3fnuz"

    @property
    def dtype(self) -> torch.dtype:
        return {Fp8Flavour.E4M3FN: torch.float8_e4m3fn, Fp8Flavour.E4M3FNUZ: torch.float8_e4m3fnuz}[self]

    @property
    def nan_byte(self) -> int:
        """A byte that decodes to NaN: the canary written into blocks nobody should read."""
        return {Fp8Flavour.E4M3FN: 0x7F, Fp8Flavour.E4M3FNUZ: 0x80}[self]


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
