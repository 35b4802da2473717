"""Stability: how K identical launches of one backend on one case agreed (`difftest run --repeat K`).

Logits (paged, ragged: classify_stability) agree within tolerance when every value that moved stayed within
the tolerance the comparison judges by. Indices (top-k, a composition's selection: index_stability) agree
within tolerance when every row whose indices moved holds a right pick in every launch: another choice among
values tied with the k-th, as vLLM's and SGLang's kernels make with first-come atomics. Each operation says
which applies (difftest.core.operation.Operation.stability).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Sequence

import torch

from difftest.core.contract import Contract
from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.poison import bits
from difftest.core.ragged import RaggedCase, RaggedContract
from difftest.core.schema import Int, Member, NonNegative, Record, Rows
from difftest.engine.comparison import tolerance
from difftest.engine.config import MAX_REPEAT
from difftest.engine.ragged_comparison import rotated
from difftest.oracles.ragged_reference import RaggedReference


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
                       contract: Contract | RaggedContract, bound: torch.Tensor | None = None) -> Stability:
    """Compare every launch with the first, under the comparison's tolerance (compare.tolerance). Positions
    past a row's window count only when the contract promises -inf there (its `mask`; `rtol` its tolerance)."""
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


def ragged_stability(reference: RaggedReference, outputs: tuple[torch.Tensor, ...], case: RaggedCase,
                     contract: RaggedContract) -> Stability:
    """classify_stability of ragged logits, in the comparison's window-relative frame (an ABSOLUTE row rotated
    by its k_start, as difftest.engine.ragged_comparison reads it)."""
    frames = tuple(got if contract.form == LogitsForm.WINDOW_RELATIVE else rotated(got, case.k_start)
                   for got in outputs)
    return classify_stability(frames, reference.logits, reference.window_lens, contract, reference.bound)


def index_stability(outputs: Sequence[torch.Tensor], wrong_rows: Callable[[torch.Tensor], Iterable[int]]) -> Stability:
    """Launches 2..K of indices [rows, k] against launch 1: a row whose indices moved is unstable when either
    launch's row is wrong (`wrong_rows`: the rows the oracle faults in one launch's indices), stable within
    tolerance when both are right picks. Indices have no distance: max_abs_diff is 0."""
    first = outputs[0]
    moved = torch.zeros(first.shape[0], dtype=torch.bool, device=first.device)
    beyond, wrong_first = moved.clone(), None
    for other in outputs[1:]:
        other = other.to(first.device)
        if other.shape != first.shape or other.dtype != first.dtype:
            moved[:], beyond[:] = True, True
            continue
        changed = (bits(other) != bits(first)).any(dim=1)
        if not changed.any():
            continue
        if wrong_first is None:
            wrong_first = _row_mask(wrong_rows(first), moved)
        moved |= changed
        beyond |= changed & (wrong_first | _row_mask(wrong_rows(other), moved))
    kind = (StabilityKind.UNSTABLE if beyond.any() else StabilityKind.WITHIN_TOLERANCE if moved.any()
            else StabilityKind.BITWISE)
    return Stability(kind, len(outputs), _rows(moved), _rows(beyond), 0.0)


def combined(parts: Sequence[Stability]) -> Stability:
    """One record of a composition's stages' (its logits and its selection): the worst kind, every row that
    moved or went past in any part, the largest difference."""
    order = (StabilityKind.UNSTABLE, StabilityKind.WITHIN_TOLERANCE, StabilityKind.BITWISE)
    return Stability(min((p.kind for p in parts), key=order.index), parts[0].launches,
                     sorted(set().union(*(p.moved_rows for p in parts))),
                     sorted(set().union(*(p.unstable_rows for p in parts))), max(p.max_abs_diff for p in parts))


def _row_mask(rows: Iterable[int], like: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros_like(like)
    mask[list(rows)] = True
    return mask
