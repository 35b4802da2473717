"""The oracle's answer for one case, computed once and shared by every backend that runs it."""

from __future__ import annotations

import dataclasses

import torch

from difftest.case import Case
from oracles.paged_mqa_logits import fp32_error_bound, reference


@dataclasses.dataclass(frozen=True)
class Reference:
    """Oracle logits with each row's limit and the fp32 rounding bound a correct backend stays inside."""

    logits: torch.Tensor  # float64 [rows, max_model_len]
    row_lens: torch.Tensor  # (rows,)
    bound: torch.Tensor  # (rows,) float32 rounding bound


def make_reference(case: Case) -> Reference:
    """Oracle logits in float64 on the case's device, the limits, and the fp32 error bound."""
    q, k = case.q_values(), case.k_values()
    bound = fp32_error_bound(q, k, case.scale_pool, case.weights, case.block_table, case.row_lens())
    return Reference(reference(case), case.row_lens().reshape(-1), bound)
