"""Planted bugs: user backends that are right except on one boundary, for the find-and-shrink tests.

Each computes the oracle's formula from the bytes it is handed (DeepGEMM's calling convention,
per-row lengths, block-split cache), then breaks one thing that only some cases reach. Load one as
`--backend-module tests.planted:block_boundary_off_by_one`.
"""

from __future__ import annotations

import torch

from difftest.backends.user import backend
from difftest.contract import Contract
from difftest.kinds import CacheLayout, LengthEncoding, MaskConvention
from tests.user_backends import logits_with_limits

CONTRACT = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                    mask=MaskConvention.TAIL_NEG_INF, devices=("cpu",), library="tests.planted")


@backend(contract=CONTRACT, name="planted-block-boundary")
def block_boundary_off_by_one(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                              context_lens: torch.Tensor, block_table: torch.Tensor,
                              max_model_len: int) -> torch.Tensor:
    """A row whose limit is a nonzero multiple of the block size loses its last position (FAIL(mask))."""
    block_size = kv_cache.shape[1]
    lens = context_lens.to(torch.int64)
    lens = torch.where((lens > 0) & (lens % block_size == 0), lens - 1, lens)
    return logits_with_limits(q, kv_cache, weights, lens, block_table, max_model_len)


@backend(contract=CONTRACT, name="planted-draft-weights")
def draft_rows_reuse_weights(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_table: torch.Tensor,
                             max_model_len: int) -> torch.Tensor:
    """Every draft row of a sequence uses the weights of its first row (FAIL(value) when next_n > 1)."""
    batch, next_n = context_lens.shape
    first = weights.reshape(batch, next_n, -1)[:, :1].expand(-1, next_n, -1).reshape(weights.shape)
    return logits_with_limits(q, kv_cache, first, context_lens.to(torch.int64), block_table, max_model_len)
