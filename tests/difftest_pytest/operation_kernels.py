"""A kernel engineer's own top-k and ragged logits kernels in plain torch, each right and with a planted bug.

The plugin tests write this file, as it is, into a pytester folder outside the package (`my_kernels.py`) and
load its functions as `my_kernels:my_topk`, `my_kernels:my_ragged`, and compositions of them: nothing in it
is difftest's but the decorator and the contracts. test_check imports it directly.

* my_topk: the k largest logits of each row's window, row-relative, -1 past the finite candidates;
  my_topk_drops_largest is the planted bug: rows wider than k lose their largest value (the (k+1)-th instead).
* my_ragged: absolute-form ragged MQA logits, -inf outside each row's window [k_start, k_end);
  my_ragged_one_short is the planted bug: every window ends one key early.
"""

from __future__ import annotations

import math

import torch

import difftest
from difftest.core.kinds import IndexConvention, LogitsForm, MaskConvention, TopkPadding, WindowForm
from difftest.core.ragged import RaggedContract
from difftest.core.topk import TopkContract

TOPK = TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_CANDIDATES,
                    window=WindowForm.STARTS_ENDS, devices=("cpu",), library="my_kernels")
RAGGED = RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF, devices=("cpu",), library="my_kernels")


def _topk(logits: torch.Tensor, k: int, row_starts: torch.Tensor, row_ends: torch.Tensor) -> torch.Tensor:
    rows, width = logits.shape
    starts, ends = row_starts.long()[:, None], row_ends.long()[:, None]
    columns = torch.arange(width)[None, :]
    masked = logits.masked_fill((columns < starts) | (columns >= ends), -math.inf)
    taken = min(k, width)
    values, picked = masked.topk(taken, dim=-1)
    out = torch.full((rows, k), -1, dtype=torch.int32)
    out[:, :taken] = (picked - starts).to(torch.int32).masked_fill(values == -math.inf, -1)
    return out


@difftest.backend(TOPK, name="my-topk")
def my_topk(logits: torch.Tensor, k: int, row_starts: torch.Tensor, row_ends: torch.Tensor) -> torch.Tensor:
    """The k largest of each row's window."""
    return _topk(logits, k, row_starts, row_ends)


@difftest.backend(TOPK, name="my-topk-drops-largest")
def my_topk_drops_largest(logits: torch.Tensor, k: int, row_starts: torch.Tensor,
                          row_ends: torch.Tensor) -> torch.Tensor:
    """The planted bug: a window wider than k loses its largest value to the (k+1)-th."""
    right = _topk(logits, k, row_starts, row_ends)
    wide = (row_ends - row_starts).long() > k
    if k + 1 <= logits.shape[1]:
        shifted = _topk(logits, k + 1, row_starts, row_ends)[:, 1:]
        right[wide] = shifted[wide]
    return right


def _ragged(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
            k_start: torch.Tensor, k_end: torch.Tensor) -> torch.Tensor:
    scores = torch.einsum("rhd,pd->rhp", q.float(), k.float()).relu()
    logits = torch.einsum("rh,rhp->rp", weights, scores) * k_scale[None, :]
    keys = torch.arange(k.shape[0])[None, :]
    return logits.masked_fill((keys < k_start.long()[:, None]) | (keys >= k_end.long()[:, None]), -math.inf)


@difftest.backend(RAGGED, name="my-ragged")
def my_ragged(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
              k_start: torch.Tensor, k_end: torch.Tensor) -> torch.Tensor:
    """sum_h w[r, h] * relu(q[r, h] . k[p]) * k_scale[p] inside each row's window, -inf outside."""
    return _ragged(q, k, k_scale, weights, k_start, k_end)


@difftest.backend(RAGGED, name="my-ragged-one-short")
def my_ragged_one_short(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                        k_start: torch.Tensor, k_end: torch.Tensor) -> torch.Tensor:
    """The planted bug: every non-empty window ends one key early."""
    return _ragged(q, k, k_scale, weights, k_start, torch.maximum(k_end - 1, k_start))
