"""The tie-aware top-k oracle (docs/reference/topk.md), written to be read.

For each row, inside its window [start, end):

    candidates = the positions whose logit is not -inf and not NaN (+inf is a candidate: SGLang forces
                 +inf on the tokens it must keep); under NanRanking.HIGHEST a NaN is a candidate too,
                 ranked above +inf
    need       = min(k, candidates)
    kth        = the need-th largest candidate value (-inf when need is 0)
    above      = candidates strictly above kth;  equal = candidates equal to kth

A result is right when its indices are distinct, inside the window, -1 exactly in the k - need slots
the contract pads, and the values they select are, as a multiset, the need largest: all `above`
positions and any need - above of the `equal` ones. The oracle therefore never picks a tie; it counts.

Values are ranked in float64 "rank space": every float32 logit as itself, +inf as the largest float64
(above every float32), NaN as +inf (HIGHEST) or as -inf (not a candidate). -0.0 equals 0.0, as values do.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from difftest.core.kinds import NanRanking
from difftest.core.topk import TopkCase

# Rows ranked at once: a float64 copy and its sort of this many logits stay a few hundred MB.
_CHUNK_ELEMENTS = 1 << 24
_ABOVE_INF = torch.finfo(torch.float64).max  # +inf's rank: above every float32, below a NaN ranked HIGHEST


@dataclasses.dataclass(frozen=True)
class TopkTruth:
    """Per row (int64 / float64 [rows] each): what any right top-k of the row must select."""

    k: int
    window: torch.Tensor  # end - start
    candidates: torch.Tensor  # positions in the window that are neither -inf nor (unless ranked) NaN
    nans: torch.Tensor  # NaN positions in the window
    kth: torch.Tensor  # float64 rank of the need-th largest candidate; -inf when need is 0
    above: torch.Tensor  # candidates ranked strictly above kth
    equal: torch.Tensor  # candidates ranked equal to kth
    nan: NanRanking

    @property
    def need(self) -> torch.Tensor:
        """min(k, candidates): how many slots must hold a candidate."""
        return self.candidates.clamp(max=self.k)

    def kth_values(self) -> torch.Tensor:
        """float64 [rows]: kth as the logit it stands for (+inf for +inf's rank, NaN for a NaN ranked highest)."""
        return rank_to_value(self.kth)


def rank_to_value(ranks: torch.Tensor) -> torch.Tensor:
    """rank_values' inverse on its ranks: the float64 maximum is +inf, +inf a NaN ranked highest."""
    return torch.where(ranks == _ABOVE_INF, math.inf, torch.where(ranks == math.inf, math.nan, ranks))


def rank_values(logits: torch.Tensor, nan: NanRanking) -> torch.Tensor:
    """float64 ranks of float32 (or float64) logits: themselves, +inf above every finite value, NaN above
    +inf (HIGHEST) or -inf (UNDEFINED: never a candidate); -0.0 as 0.0."""
    ranks = logits.to(torch.float64) + 0.0  # + 0.0 turns -0.0 into 0.0
    ranks = torch.where(torch.isposinf(ranks), _ABOVE_INF, ranks)
    return ranks.nan_to_num(nan=math.inf if nan == NanRanking.HIGHEST else -math.inf, posinf=math.inf,
                            neginf=-math.inf)


def topk_of_logits(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int,
                   nan: NanRanking = NanRanking.HIGHEST) -> TopkTruth:
    """The truth of a top-k over `logits` [rows, width] (any float dtype: a pipeline hands the exact
    float64 logits of its logits stage), windows [starts, ends) and `k`."""
    parts = [_truth_rows(logits[first:last], starts[first:last], ends[first:last], k, nan)
             for first, last in _row_chunks(*logits.shape)]
    fields = [torch.cat([part[i] for part in parts]) if parts else torch.zeros(0, dtype=torch.int64)
              for i in range(6)]
    window, candidates, nans, kth, above, equal = fields
    return TopkTruth(k=k, window=window, candidates=candidates, nans=nans, kth=kth.double(), above=above,
                     equal=equal, nan=nan)


def reference(case: TopkCase, nan: NanRanking = NanRanking.HIGHEST) -> TopkTruth:
    """topk_of_logits of a TopkCase, on the case's device."""
    return topk_of_logits(case.logits, case.starts, case.ends, case.k, nan)


def _truth_rows(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int,
                nan: NanRanking) -> tuple[torch.Tensor, ...]:
    """(window, candidates, nans, kth, above, equal) of a slice of rows."""
    columns = torch.arange(logits.shape[1], device=logits.device)
    inside = (columns >= starts[:, None]) & (columns < ends[:, None])
    ranks = torch.where(inside, rank_values(logits, nan), -math.inf)  # outside the window: never a candidate
    candidates = (ranks > -math.inf).sum(dim=1)
    need = candidates.clamp(max=k)
    descending = ranks.sort(dim=1, descending=True).values
    kth = descending.gather(1, (need - 1).clamp(min=0)[:, None])[:, 0]
    kth = torch.where(need > 0, kth, -math.inf)
    above = (ranks > kth[:, None]).sum(dim=1)
    equal = torch.where(need > 0, (ranks == kth[:, None]).sum(dim=1), 0)
    nans = (torch.isnan(logits) & inside).sum(dim=1)
    return ends - starts, candidates, nans, kth, above, equal


def _row_chunks(rows: int, width: int) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMENTS // max(width, 1))
    return [(first, min(first + step, rows)) for first in range(0, rows, step)]


def one_answer(case: TopkCase, nan: NanRanking = NanRanking.HIGHEST) -> torch.Tensor:
    """int64 [rows, k]: one right answer, row-relative, in descending order of value with ties by the
    smaller column, -1 past the candidates. Any other choice among the ties is as right (TopkTruth)."""
    columns = torch.arange(case.width, device=case.device)
    inside = (columns >= case.starts[:, None]) & (columns < case.ends[:, None])
    ranks = torch.where(inside, rank_values(case.logits, nan), -math.inf)
    # A stable sort of the negated ranks: descending values, equal ones in column order.
    order = (-ranks).sort(dim=1, stable=True).indices[:, :case.k]
    picked = ranks.gather(1, order) > -math.inf
    answer = torch.where(picked, order - case.starts[:, None], -1)
    missing = case.k - answer.shape[1]  # a row narrower than k: pad the slots it has no column for
    return torch.nn.functional.pad(answer, (0, missing), value=-1) if missing > 0 else answer


def topk_within(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int, tolerance: torch.Tensor,
                nan: NanRanking = NanRanking.HIGHEST) -> tuple[torch.Tensor, TopkTruth]:
    """(ranked logits, truth) of a top-k over logits that a right logits stage computes only to within
    `tolerance` [rows] of `logits` (the exact ones): a candidate whose exact value lies within the tolerance of
    the row's exact k-th value may rank on either side of it in a right stage's output, so it is ranked as
    equal to it (any of them may be picked); every other candidate keeps its place. The ranked logits are
    float64 [rows, width], the values a comparison reads the picks' ranks from."""
    exact = topk_of_logits(logits, starts, ends, k, nan)
    values = logits.to(torch.float64)
    columns = torch.arange(logits.shape[1], device=logits.device)
    inside = (columns >= starts[:, None]) & (columns < ends[:, None])
    kth = exact.kth[:, None]
    near = inside & (kth.abs() < _ABOVE_INF) & ((values - kth).abs() <= tolerance.to(torch.float64)[:, None])
    ranked = torch.where(near, kth, values)
    return ranked, topk_of_logits(ranked, starts, ends, k, nan)
