"""Stability: how K identical launches of one backend on one case agreed (`difftest run --repeat K`)."""

from __future__ import annotations

import dataclasses
import enum

import torch

from difftest.core.contract import Contract
from difftest.core.kinds import MaskConvention
from difftest.core.poison import bits
from difftest.core.schema import Int, Member, NonNegative, Record, Rows
from difftest.engine.comparison import tolerance
from difftest.engine.config import MAX_REPEAT


class StabilityKind(str, enum.Enum):
    """How identical launches of one backend on one case agreed."""

    BITWISE = "bitwise-stable"  # every launch gave the same bits
    WITHIN_TOLERANCE = "stable-within-tolerance"  # bits moved, never further than the backend's tolerance
    UNSTABLE = "unstable"  # some launch moved a value past the tolerance, or changed a -inf, NaN or poison


@dataclasses.dataclass(frozen=True)
class Stability(Record):
    """Launches 2..K compared with launch 1, over the positions the comparison checks."""

    kind: Member(StabilityKind)
    launches: Int(1, MAX_REPEAT)
    moved_rows: Rows  # rows whose bits changed in any launch
    unstable_rows: Rows  # rows that moved past the tolerance (a subset of moved_rows)
    max_abs_diff: NonNegative  # largest |launch k - launch 1| between finite values inside the windows


def classify_stability(outputs: tuple[torch.Tensor, ...], expected: torch.Tensor, row_lens: torch.Tensor,
                       contract: Contract, bound: torch.Tensor | None = None) -> Stability:
    """Compare every launch with the first, under the comparison's tolerance (compare.tolerance). Positions
    past a row's window count only when the contract promises -inf there."""
    rows, width = expected.shape
    inside = torch.arange(width, device=expected.device)[None, :] < row_lens.to(expected.device)[:, None]
    checked = inside | (contract.mask == MaskConvention.TAIL_NEG_INF)
    tol = tolerance(expected, inside, contract.rtol, bound)
    first = outputs[0].to(expected.device)
    moved = torch.zeros(rows, dtype=torch.bool, device=expected.device)
    beyond, max_diff = moved.clone(), 0.0
    for other in outputs[1:]:
        other = other.to(expected.device)
        if other.shape != first.shape or other.dtype != first.dtype:
            moved[:], beyond[:] = True, True
            continue
        changed = (bits(other) != bits(first)) & checked
        a, b = first.double(), other.double()
        finite = inside & torch.isfinite(a) & torch.isfinite(b)
        diff = torch.where(finite, (a - b).abs(), 0.0)
        moved |= changed.any(dim=1)
        beyond |= (changed & ~(finite & (diff <= tol[:, None]))).any(dim=1)
        max_diff = max(max_diff, float(torch.where(changed, diff, 0.0).max()))
    kind = (StabilityKind.UNSTABLE if beyond.any() else StabilityKind.WITHIN_TOLERANCE if moved.any()
            else StabilityKind.BITWISE)
    return Stability(kind, len(outputs), _rows(moved), _rows(beyond), max_diff)


def _rows(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask).flatten().tolist()
