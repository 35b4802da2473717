"""User backends for the plugin tests: the oracle with one planted bug, and one that needs a GPU.

Both compute the oracle's formula from the bytes they are handed (DeepGEMM's calling convention:
per-row lengths, block-split cache). The tests load them as `planted:off_by_one` from a pytester
directory and import them directly as tests.difftest_pytest.planted_backends.
"""

from __future__ import annotations

import torch

import difftest
from difftest import CacheLayout, Contract, LengthEncoding, MaskConvention
from tests.user_backends import logits_with_limits

CONTRACT = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF)


@difftest.backend(CONTRACT, name="off-by-one")
def off_by_one(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
               block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """The planted bug: every row with a window loses its last position (a -inf where a value belongs)."""
    lens = (context_lens.to(torch.int64) - 1).clamp(min=0)
    return logits_with_limits(q, kv_cache, weights, lens, block_table, max_model_len)


@difftest.backend(Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                           mask=MaskConvention.TAIL_NEG_INF, devices=("cuda",)), name="cuda-only")
def cuda_only(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
              block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Correct, but declares that it runs on CUDA only."""
    return logits_with_limits(q, kv_cache, weights, context_lens.to(torch.int64), block_table, max_model_len)
