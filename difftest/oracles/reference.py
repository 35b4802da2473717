"""The oracle's answer for one case, computed once and shared by every backend that runs it.

Two oracles (difftest.core.kinds.OracleKind): EXACT, the float64 torch oracle (difftest.oracles.paged_mqa_logits),
which is the truth; FAST, the fused Triton oracle (difftest.oracles.fused), fp32 sums of exact products whose
per-row bound covers its own rounding and a correct fp32 backend's together. Both give a Reference of
the same form, so the comparison does not know which one ran.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.core.case import Case
from difftest.core.errors import require
from difftest.core.kinds import OracleKind
from difftest.oracles.fused import fused_reference
from difftest.oracles.paged_mqa_logits import fp32_error_bound, reference


@dataclasses.dataclass(frozen=True)
class Reference:
    """Oracle logits with each row's limit and the fp32 rounding bound a correct backend stays inside."""

    logits: torch.Tensor  # float64 (EXACT) or float32 (FAST) [rows, max_model_len]
    row_lens: torch.Tensor  # (rows,)
    bound: torch.Tensor  # (rows,) float32 rounding bound
    oracle: OracleKind = OracleKind.EXACT
    next_n: int | None = None  # rows per request: lets a failure's wrong windows be explained by request


def make_reference(case: Case, oracle: OracleKind = OracleKind.EXACT) -> Reference:
    """The oracle's logits on the case's device, the limits, and the fp32 error bound."""
    require(oracle != OracleKind.NONE, "oracle", oracle.value,
            "exact or fast here: without an oracle only a consensus run judges (difftest.engine.consensus)")
    row_lens = case.row_lens().reshape(-1)
    if oracle == OracleKind.FAST:
        fused = fused_reference(case)
        return Reference(fused.logits, row_lens, fused.bound, oracle, case.next_n)
    q, k = case.q_values(), case.k_values()
    bound = fp32_error_bound(q, k, case.scale_pool, case.weights, case.block_table, case.row_lens())
    return Reference(reference(case), row_lens, bound, oracle, case.next_n)
