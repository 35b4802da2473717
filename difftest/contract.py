"""What a backend declares about itself; the engine adapts the canonical case to it."""

from __future__ import annotations

import dataclasses
import enum

import torch

from difftest.fp8 import Fp8Flavour


class LengthEncoding(str, enum.Enum):
    """How the causal limits reach the kernel (DOMAIN.md section 2)."""

    PER_ROW = "per-row"  # (B, next_n): len[b, j] = max(L_b - next_n + j + 1, 0)
    PER_SEQUENCE = "per-sequence"  # (B,): L_b; the kernel derives each row's limit itself
    FLATTENED = "flattened"  # (B * next_n,) rows of next_n = 1, block-table rows repeated
    FLATTENED_INDICES = "flattened-indices"  # (T,) limits plus (T,) request id of each row
    PREFIX_SUM = "prefix-sum"  # (B + 1,) prefix sums of L_b over flat token indices (ragged)


class CacheLayout(str, enum.Enum):
    """Byte layout of the uint8 [num_blocks, block_size, 1, D + 4] cache (DOMAIN.md section 3)."""

    BLOCK_SPLIT = "block-split"  # per block: block_size * D key bytes, then block_size fp32 scales
    TOKEN_INTERLEAVED = "token-interleaved"  # per token: D key bytes, then its 4 scale bytes


class MaskConvention(str, enum.Enum):
    """What a backend promises about positions at or past a row's limit."""

    TAIL_NEG_INF = "tail-neg-inf"  # every position past the limit is -inf
    TAIL_UNSPECIFIED = "tail-unspecified"  # past the limit anything may be written (not cleaned)


@dataclasses.dataclass(frozen=True)
class Contract:
    """A backend's declared interface. `None` in a `supported_*` field means any value."""

    length_encoding: LengthEncoding
    cache_layout: CacheLayout
    mask: MaskConvention
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    output_dtype: torch.dtype = torch.float32
    rtol: float = 1e-3  # allowed error, relative to the row's largest |expected| in the window
    devices: tuple[str, ...] = ("cpu", "cuda")
    archs: tuple[str, ...] | None = None  # e.g. ("sm90",): CUDA compute capabilities accepted
    next_n: tuple[int, ...] | None = None
    block_sizes: tuple[int, ...] | None = None  # a case of another block size is re-paged when 1 is listed
    head_dims: tuple[int, ...] | None = None
    heads_multiple_of: int = 1
    heads_power_of_two: bool = False  # e.g. all heads as one tl.arange block
    writes_into_output: bool = False  # the backend fills a buffer the engine allocates (poisoned)
    library: str = ""  # distribution name and version actually loaded, for the report
