"""Contracts: the strings the CLI and reports use for each enum, the defaults a backend gets, and the
working memory a backend declares."""

from __future__ import annotations

import pytest
import torch

from difftest.core.contract import Contract, WorkingMemory
from difftest.core.errors import SpecError
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention


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
    assert c.working_memory == WorkingMemory() and c.working_memory.bytes_for(1 << 31, 64) == 0


def test_working_memory_is_linear_in_the_logits_and_the_heads():
    stage1 = WorkingMemory(bytes_per_logit_per_head=4)
    assert stage1.bytes_for(1 << 31, 64) == 512 << 30, "AITER's stage1 at H = 64 on 2^31 logits: 512 GiB"
    assert WorkingMemory(bytes_per_logit=2, bytes_per_logit_per_head=1).bytes_for(10, 3) == 10 * (2 + 3)


@pytest.mark.parametrize("field, value", [("bytes_per_logit", -1), ("bytes_per_logit_per_head", 0.5),
                                          ("bytes_per_logit", True)])
def test_working_memory_takes_whole_byte_counts_only(field, value):
    with pytest.raises(SpecError) as info:
        WorkingMemory(**{field: value})
    assert info.value.field == f"working_memory.{field}" and info.value.expected == "an integer >= 0", f"{info.value}"
