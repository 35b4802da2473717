"""Planted bugs: user backends that are right except on one boundary, for the find-and-shrink tests.

Each computes the oracle's formula from the bytes it is handed (DeepGEMM's calling convention,
per-row lengths, block-split cache), then breaks one thing that only some cases reach. Load one as
`--backend-module tests.planted:block_boundary_off_by_one`.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from difftest.backends.user import backend
from difftest.core.contract import Contract, Siblings
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
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


# A planted performance bug: two siblings (one Siblings group) that compute the same right logits,
# one of them sleeping on every call, far past its declared slowdown of 2; `--time` must flag it.
TWINS = dataclasses.replace(CONTRACT, siblings=Siblings("planted-twins", slowdown=2.0))
SLEEP = 0.05  # seconds per call: tens of times a toy case's own time


@backend(contract=TWINS, name="planted-quick-twin")
def quick_twin(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
               block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Right, and as fast as the formula."""
    return logits_with_limits(q, kv_cache, weights, context_lens.to(torch.int64), block_table, max_model_len)


@backend(contract=TWINS, name="planted-sleepy-twin")
def sleepy_twin(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Right, but SLEEP seconds slower per call than its twin: a bug no correctness check sees."""
    time.sleep(SLEEP)
    return logits_with_limits(q, kv_cache, weights, context_lens.to(torch.int64), block_table, max_model_len)


# A planted batch-dependent bug: right on any launch of at most BATCH_LIMIT requests, the last row
# wrong on a larger one, as a kernel whose schedule changes with the batch would be. It declares
# itself batchable, so `difftest fuzz` merges small cases for it and must re-run a failure alone.
BATCHABLE = dataclasses.replace(CONTRACT, batchable=True)
BATCH_LIMIT = 4


@backend(contract=BATCHABLE, name="planted-batch-size")
def wrong_past_batch_limit(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                           context_lens: torch.Tensor, block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Right up to BATCH_LIMIT requests; past it, the last row's window loses its last key (FAIL(mask))."""
    lens = context_lens.to(torch.int64).clone()
    if q.shape[0] > BATCH_LIMIT:
        lens.view(-1)[-1] = (lens.view(-1)[-1] - 1).clamp(min=0)
    return logits_with_limits(q, kv_cache, weights, lens, block_table, max_model_len)


@backend(contract=BATCHABLE, name="planted-batchable-block-boundary")
def batchable_block_boundary(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                             context_lens: torch.Tensor, block_table: torch.Tensor,
                             max_model_len: int) -> torch.Tensor:
    """block_boundary_off_by_one, declared batchable: wrong alone as in any batch."""
    return block_boundary_off_by_one(q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=BATCHABLE, name="planted-after-empty")
def wrong_after_empty_request(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                              context_lens: torch.Tensor, block_table: torch.Tensor,
                              max_model_len: int) -> torch.Tensor:
    """A request right after an empty one (in the launch) loses its last key in every row (FAIL(mask)),
    the shape of DeepGEMM's zero-length bug: in a batch, a member ending in an empty request spoils
    the next member's first one."""
    lens = context_lens.to(torch.int64)
    after_empty = torch.zeros_like(lens[:, -1], dtype=torch.bool)
    after_empty[1:] = lens[:-1, -1] == 0
    lens = torch.where(after_empty[:, None], (lens - 1).clamp(min=0), lens)
    return logits_with_limits(q, kv_cache, weights, lens, block_table, max_model_len)


# A planted slow failure: every call takes SLOW_CALL seconds and every case fails (its last column is written
# where rows end before it: every case has such a row), so shrinking a case takes many probes of that cost,
# far more than a small share of a fuzz budget, and a campaign finds it in its first case.
SLOW_CALL = 0.25


@backend(contract=CONTRACT, name="planted-slow-last-column")
def slow_last_column(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                     block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Sleeps SLOW_CALL seconds per call, then writes 0.0 to the last column of every row (FAIL(mask) where
    the row's window ends before it)."""
    time.sleep(SLOW_CALL)
    logits = logits_with_limits(q, kv_cache, weights, context_lens.to(torch.int64), block_table, max_model_len)
    logits[:, -1] = 0.0
    return logits


# Planted bugs for the metamorphic relations (tests/difftest/engine/test_metamorphic.py): each is wrong on a
# case the oracle judges (so the oracle catches it too), and wrong differently on the related case.

@backend(contract=CONTRACT, name="planted-pages-in-id-order")
def pages_in_id_order(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                      block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Reads each sequence's used blocks in the order of their physical ids, not the table's (as a kernel
    that assumes its allocator hands out ascending blocks): wrong wherever a table is not ascending."""
    block_size = kv_cache.shape[1]
    used = (context_lens.to(torch.int64)[:, -1] + block_size - 1) // block_size  # (B,)
    table = block_table.clone()
    for b, width in enumerate(used.tolist()):
        table[b, :width] = torch.sort(table[b, :width]).values
    return logits_with_limits(q, kv_cache, weights, context_lens.to(torch.int64), table, max_model_len)


@backend(contract=CONTRACT, name="planted-first-request-cap")
def first_request_cap(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                      block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Caps every row's window at the first request's length (a schedule sized from request 0)."""
    lens = context_lens.to(torch.int64)
    return logits_with_limits(q, kv_cache, weights, lens.clamp(max=int(lens[0, -1])), block_table, max_model_len)


@backend(contract=CONTRACT, name="planted-accumulator-at-one")
def accumulator_at_one(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                       block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Starts every head sum at 1.0 instead of 0.0: each logit in a window is one too large, which no power of
    two scales with it."""
    return logits_with_limits(q, kv_cache, weights, context_lens.to(torch.int64), block_table, max_model_len) + 1.0


@backend(contract=CONTRACT, name="planted-weights-of-next-head")
def weights_of_next_head(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Weights head h with head h + 1's weight (an off-by-one head stride)."""
    return logits_with_limits(q, kv_cache, weights.roll(-1, dims=1), context_lens.to(torch.int64), block_table,
                              max_model_len)


@backend(contract=CONTRACT, name="planted-one-key-past")
def one_key_past(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Scores one key past every window (`<=` for `<`), where a sequence's slot past its last token holds
    whatever the pool holds there (a NaN canary in the cases drawn)."""
    lens = (context_lens.to(torch.int64) + 1).clamp(max=max_model_len)
    block_size = kv_cache.shape[1]
    width = block_table.shape[1] * block_size
    return logits_with_limits(q, kv_cache, weights, lens.clamp(max=width), block_table, max_model_len)
