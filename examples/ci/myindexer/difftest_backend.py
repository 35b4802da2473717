"""The kernel as difftest sees it (docs/writing-a-backend.md in difftest): its contract, and the call.
difftest.toml's matrix names it `myindexer.difftest_backend:paged_mqa_logits`; only CI imports it."""

from __future__ import annotations

import difftest
import myindexer
from difftest import CacheLayout, Contract, LengthEncoding, MaskConvention
from myindexer import kernel

CONTRACT = Contract(
    length_encoding=LengthEncoding.PER_SEQUENCE,  # context_lens is [B]; the kernel derives each row's limit
    cache_layout=CacheLayout.BLOCK_SPLIT,  # per block: all keys, then all scales
    mask=MaskConvention.TAIL_NEG_INF,  # every position past a row's limit is -inf
    devices=("cpu", "cuda"),
    next_n=(1, 2, 3, 4),
    heads=(32, 64),
    head_dims=(64, 128),
    block_sizes=(16, 64),
    max_context=4096,
    library=f"myindexer {myindexer.__version__}",
)


@difftest.backend(CONTRACT, name="myindexer")
def paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """myindexer's kernel, called as its production caller calls it."""
    return kernel.paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_model_len)
