"""The oracle's answer for one ragged case, computed once and shared by every backend that runs it (the
sibling of difftest.oracles.reference for paged logits).

Two oracles (difftest.core.kinds.OracleKind): EXACT, the float64 torch oracle (difftest.oracles.ragged_mqa_logits),
which is the truth; FAST, the fused Triton oracle (difftest.oracles.fused_ragged), fp32 sums of exact products with
a rigorous per-row bound. Both answer in the window-relative frame (column j of row i is key k_start[i] + j), at
the width of the kernel's output, so the comparison does not know which one ran.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.core.kinds import OracleKind
from difftest.core.ragged import RaggedCase
from difftest.oracles.fused_ragged import fused_ragged_reference
from difftest.oracles.ragged_mqa_logits import error_bound, reference


@dataclasses.dataclass(frozen=True)
class RaggedReference:
    """Oracle logits with the part of each row's window they hold and the fp32 rounding bound a correct
    backend stays inside."""

    logits: torch.Tensor  # float64 (EXACT) or float32 (FAST) [rows, width], window-relative, -inf past each window
    window_lens: torch.Tensor  # (rows,) int64: min(k_end - k_start, width)
    bound: torch.Tensor  # (rows,) float32 rounding bound
    oracle: OracleKind = OracleKind.EXACT


def make_ragged_reference(case: RaggedCase, width: int, oracle: OracleKind = OracleKind.EXACT) -> RaggedReference:
    """The oracle's window-relative logits of `case` at `width` columns on the case's device, each row's
    window length in that frame, and the fp32 error bound."""
    lens = case.window_lens().clamp(max=width)
    if oracle == OracleKind.FAST:
        fused = fused_ragged_reference(case, width)
        return RaggedReference(fused.logits, lens, fused.bound, oracle)
    return RaggedReference(reference(case, width), lens, error_bound(case), oracle)
