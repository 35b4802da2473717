"""Contracts: the strings the CLI and reports use for each enum, and the defaults a backend gets."""

from __future__ import annotations

import torch

from difftest.contract import Contract
from difftest.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention


def test_enum_strings():
    assert [e.value for e in LengthEncoding] == ["per-row", "per-sequence", "flattened", "flattened-indices",
                                                 "prefix-sum"]
    assert [e.value for e in CacheLayout] == ["block-split", "token-interleaved"]
    assert [e.value for e in MaskConvention] == ["tail-neg-inf", "tail-unspecified"]
    assert LengthEncoding("per-row") is LengthEncoding.PER_ROW and CacheLayout("block-split") is CacheLayout.BLOCK_SPLIT


def test_defaults_accept_everything():
    c = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF)
    assert (c.fp8, c.output_dtype, c.devices) == (Fp8Flavour.E4M3FN, torch.float32, ("cpu", "cuda")), f"{c=}"
    assert (c.next_n, c.block_sizes, c.head_dims, c.archs, c.heads_multiple_of) == (None, None, None, None, 1)
    assert not c.writes_into_output and 0 < c.rtol <= 1e-2, f"{c=}"
