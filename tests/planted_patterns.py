"""Planted bugs of the field's known patterns, each to be named in its result's explanation (issue 42): DeepGEMM
2.8.1's request after an empty one scored with the empty request's q and weights, and a draft-row index off by
one; and a top-k's row-relative indices under an absolute contract. Each logits one computes the oracle's
formula from the bytes it is handed (per-row lengths, block-split cache), then breaks one thing. Load one as
`--backend-module tests.planted_patterns:scored_with_the_empty_requests_q`.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.backends.torch_topk import TorchTopk
from difftest.backends.user import backend
from difftest.core.kinds import IndexConvention
from difftest.core.topk import TopkInputs
from tests.planted import CONTRACT
from tests.planted_topk import CONTRACT as TOPK_CONTRACT
from tests.user_backends import logits_with_limits


@backend(contract=CONTRACT, name="planted-empty-requests-q")
def scored_with_the_empty_requests_q(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                                     context_lens: torch.Tensor, block_table: torch.Tensor,
                                     max_model_len: int) -> torch.Tensor:
    """A request right after an empty one is scored with the empty request's q and weights, its own keys and
    window (docs/findings/deepgemm-zero-length-request.md): FAIL(value) with every mask right."""
    batch, next_n = q.shape[:2]
    after_empty = torch.zeros(batch, dtype=torch.bool)
    after_empty[1:] = context_lens.reshape(batch, next_n)[:-1, -1].cpu() == 0
    source = torch.where(after_empty, torch.arange(batch) - 1, torch.arange(batch))
    rows = (source[:, None] * next_n + torch.arange(next_n)).reshape(-1)  # weights are [B * next_n, H]
    return logits_with_limits(q[source.to(q.device)], kv_cache, weights[rows.to(weights.device)], context_lens,
                              block_table, max_model_len)


@backend(contract=CONTRACT, name="planted-draft-row-off-by-one")
def draft_row_off_by_one(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Draft row j reads row j + 1's limit, the last row wrapping to row 0's (a draft index off by one within
    the request): FAIL(mask); at next_n 2 it is the same rows as the draft rows reversed."""
    batch, next_n = q.shape[:2]
    limits = context_lens.reshape(batch, next_n).roll(-1, dims=1)
    return logits_with_limits(q, kv_cache, weights, limits, block_table, max_model_len)


class RelativeForAbsolute:
    """A top-k that returns row-relative indices (SGLang's torch reference) under a contract that promises
    absolute ones: every index lower by its row's start. FAIL(out-of-window) where a window starts past 0."""

    name = "planted-relative-for-absolute"
    contract = dataclasses.replace(TOPK_CONTRACT, index=IndexConvention.ABSOLUTE)

    def unavailable_reason(self, device: str) -> str | None:
        """CPU only."""
        return None if device == "cpu" else "planted bugs run on the CPU"

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The row-relative answer of the torch reference, as it is."""
        return TorchTopk()(inputs, None)
