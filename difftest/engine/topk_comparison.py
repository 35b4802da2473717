"""Row-by-row judgement of a top-k kernel's indices against the tie-aware oracle, under its contract.

Every slot of a row is classified first: a -1 pad, an index that names no column of the row (garbage),
one outside the row's window, a second occurrence of a column (duplicate), or a distinct pick inside the
window, whose value is then ranked against the oracle's k-th value (difftest.oracles.topk). A row is
right when it has no garbage, out-of-window or duplicate slot, exactly the pads its contract's padding
convention asks for, every one of the oracle's `above` values and enough of its `equal` ones (any choice
among the ties), and, where the contract promises order, its values in descending order with the pads
last. Each symptom is a verdict; a row takes the worst (difftest.core.verdict.SEVERITY).

How the conventions change what is right (docs/reference/topk.md):
* ABSOLUTE indices are columns; ROW_RELATIVE ones count from the window's start.
* PAST_CANDIDATES: -1 in the k - min(k, candidates) slots no candidate fills (the oracle's own truth).
* PAST_WINDOW: -inf positions inside the window rank as the lowest values: -1 only past the window length.
* OUTSIDE_COLUMNS: no -1; the slots the candidates leave hold distinct non-candidate indices: columns outside
  the window, -inf positions inside it, or indices past the row's width (the caller masks them all).
* NanRanking.UNDEFINED: a row with a NaN in its window is judged on safety alone (no garbage,
  out-of-window or duplicate slot): what the value of a NaN-ranked top-k should be is not promised.

A failing comparison is explained where a known pattern accounts for every wrong row (TopkPattern): every
index off by its row's start (the other index convention's answer) when adding (or taking away) each row's
start makes the whole answer right.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import torch

from difftest.core.kinds import IndexConvention, NanRanking, TopkPadding
from difftest.core.topk import TopkCase, TopkContract
from difftest.core.verdict import Verdict, worst
from difftest.oracles.topk import TopkTruth, rank_to_value, rank_values

# The symptoms a row can show, each with the verdict it takes (worst first, as in SEVERITY).
KINDS = (Verdict.FAIL_GARBAGE, Verdict.FAIL_OUT_OF_WINDOW, Verdict.FAIL_DUPLICATE, Verdict.FAIL_PADDING,
         Verdict.FAIL_MISSING, Verdict.FAIL_ORDER)
_SAFETY = (Verdict.FAIL_GARBAGE, Verdict.FAIL_OUT_OF_WINDOW, Verdict.FAIL_DUPLICATE)
_NOT_A_COLUMN = -(1 << 62)  # what a NaN or fractional index becomes: a column no row has


class TopkPattern(str, enum.Enum):
    """What explains every wrong row of a top-k answer (its values are JSON's)."""

    # every index lower by its row's start: row-relative indices under an absolute contract
    ROW_RELATIVE_FOR_ABSOLUTE = "row-relative-for-absolute"
    # every index higher by its row's start: absolute indices under a row-relative contract (vllm#56749)
    ABSOLUTE_FOR_ROW_RELATIVE = "absolute-for-row-relative"


PATTERN_WORDS = {
    TopkPattern.ROW_RELATIVE_FOR_ABSOLUTE: "every index lower by its row's start (row-relative indices for an absolute "
                                           "contract)",
    TopkPattern.ABSOLUTE_FOR_ROW_RELATIVE: "every index higher by its row's start (absolute indices for a row-relative "
                                           "contract)",
}


@dataclasses.dataclass(frozen=True)
class TopkMismatch:
    """The first wrong row: the slot that shows its worst symptom (-1 when no slot does: a candidate that
    no slot holds), what the slot holds, the oracle's k-th value and the row's window."""

    row: int
    slot: int
    kind: Verdict
    index: int | None  # what the slot holds, as the kernel wrote it; None for a row-level symptom
    value: float | None  # the logit of the column it names (None when it names none)
    kth: float  # the oracle's k-th largest candidate of the row (-inf when the window holds none)
    window: tuple[int, int]  # [start, end)

    def describe(self) -> str:
        """One line: 'row 3 slot 7: FAIL(out-of-window): index 130 (value 2.5) outside [0, 128); k-th 1.25'."""
        where = f"row {self.row}" + ("" if self.slot < 0 else f" slot {self.slot}")
        held = "" if self.index is None else f"index {self.index}" + (
            "" if self.value is None else f" (value {self.value:g})")
        return (f"{where}: {self.kind.value}: {held or 'a candidate no slot holds'}; window [{self.window[0]}, "
                f"{self.window[1]}), k-th value {self.kth:g}")


@dataclasses.dataclass(frozen=True)
class TopkComparison:
    """Everything a report says about one top-k kernel on one case."""

    rows: int
    verdict: Verdict
    symptoms: dict[Verdict, tuple[int, ...]]  # every row showing each kind of failure (a row may show several)
    rows_by_verdict: dict[Verdict, tuple[int, ...]]  # each failing row under its worst kind: the per-row verdicts
    wrong_rows: tuple[int, ...]  # rows whose selected set is wrong (every failure but FAIL(order)): the headline
    wrong_tokens: tuple[int, ...]  # per wrong row: tokens the right set holds and the row lacks (or, lacking
    # none, holds and no right set does)
    safety_rows: tuple[int, ...]  # rows judged on safety alone (a NaN in the window, NaN ranking undefined)
    first_mismatch: TopkMismatch | None
    pattern: TopkPattern | None = None  # what explains every wrong row, where a known pattern does

    def row_verdict(self, row: int) -> Verdict:
        """The verdict of one row: its worst symptom, PASS when it has none."""
        return next((kind for kind, rows in self.rows_by_verdict.items() if row in rows), Verdict.PASS)

    def headline(self) -> str:
        """'3/16 rows select a wrong set (41 tokens); first: row 2 slot 5: FAIL(missing): ...'."""
        text = f"{len(self.wrong_rows)}/{self.rows} rows select a wrong set ({sum(self.wrong_tokens)} tokens)"
        ordered = len(self.rows_by_verdict.get(Verdict.FAIL_ORDER, ()))
        text += f", {ordered} in the wrong order" if ordered else ""
        text += f"; pattern: {PATTERN_WORDS[self.pattern]}" if self.pattern is not None else ""
        return text + (f"; first: {self.first_mismatch.describe()}" if self.first_mismatch else "")


def compare_topk(reference: TopkTruth, got_indices: torch.Tensor, case: TopkCase,
                 contract: TopkContract) -> TopkComparison:
    """Judge `got_indices` [rows, k] (any integer or float dtype) for `case` under `contract`; `reference` is
    the oracle's truth for the case at the contract's NaN ranking (difftest.oracles.topk.reference).
    ValueError when the indices have the wrong shape."""
    if tuple(got_indices.shape) != (case.rows, case.k):
        raise ValueError(f"backend returned indices of shape {tuple(got_indices.shape)}, "
                         f"expected {(case.rows, case.k)}")
    judged = _judged(reference, got_indices.to(case.device), case, contract)
    return dataclasses.replace(judged, pattern=_pattern(reference, got_indices.to(case.device), case, contract, judged))


def _pattern(reference: TopkTruth, got: torch.Tensor, case: TopkCase, contract: TopkContract,
             judged: TopkComparison) -> TopkPattern | None:
    """The other index convention's answer: where moving every index (not the -1 pads) by its row's start
    makes every row right, and some wrong row's window starts past 0."""
    wrong = torch.tensor(judged.wrong_rows, dtype=torch.int64, device=case.device)
    if not judged.verdict.failed or not wrong.numel() or not bool((case.starts[wrong] > 0).any()):
        return None
    absolute = contract.index == IndexConvention.ABSOLUTE
    index = _as_index(got)
    moved = torch.where(index >= 0, index + (1 if absolute else -1) * case.starts[:, None], index)
    if _judged(reference, moved, case, contract).verdict.failed:
        return None
    return TopkPattern.ROW_RELATIVE_FOR_ABSOLUTE if absolute else TopkPattern.ABSOLUTE_FOR_ROW_RELATIVE


def _judged(reference: TopkTruth, got_indices: torch.Tensor, case: TopkCase, contract: TopkContract) -> TopkComparison:
    """compare_topk without its explanation."""
    slots = _Slots.of(got_indices, case, contract, reference.nan)
    rule = _Rule.of(reference, contract)
    faults = _faults(slots, rule, contract)
    safety = (reference.nans > 0) & torch.tensor(reference.nan == NanRanking.UNDEFINED, device=case.device)
    for kind in KINDS:
        if kind not in _SAFETY:
            faults[kind] = faults[kind] & ~safety
    return _summarised(faults, slots, rule, case, safety)


@dataclasses.dataclass(frozen=True)
class _Slots:
    """Each slot of each row, classified ([rows, k] each)."""

    index: torch.Tensor  # int64: as the kernel wrote it (_NOT_A_COLUMN for NaN or fractions)
    pad: torch.Tensor  # -1
    garbage: torch.Tensor  # names no column of the row
    outside: torch.Tensor  # a column of the row outside its window
    duplicate: torch.Tensor  # a column an earlier slot of the row already holds
    pick: torch.Tensor  # a distinct column inside the window
    rank: torch.Tensor  # float64 rank of the column a slot names (-inf where it names none)
    value: torch.Tensor  # float32 logit of that column (NaN where it names none)

    @classmethod
    def of(cls, got: torch.Tensor, case: TopkCase, contract: TopkContract, nan: NanRanking) -> _Slots:
        index = _as_index(got)
        pad = index == -1
        column = index if contract.index == IndexConvention.ABSOLUTE else index + case.starts[:, None]
        in_row = (column >= 0) & (column < case.width)
        # Fills past the row's width are no column, but an OUTSIDE_COLUMNS caller masks them like any fill.
        past_row = (column >= case.width) & (contract.padding == TopkPadding.OUTSIDE_COLUMNS)
        garbage = ~pad & ~in_row & ~past_row
        named = ~pad & ~garbage
        inside = named & (column >= case.starts[:, None]) & (column < case.ends[:, None])
        duplicate = _later_occurrences(torch.where(named, column, _NOT_A_COLUMN), named)
        safe = torch.where(in_row, column, 0)
        rank = torch.where(in_row & named, rank_values(case.logits, nan).gather(1, safe), -math.inf)
        value = torch.where(in_row & named, case.logits.gather(1, safe), math.nan)
        return cls(index, pad, garbage, named & ~inside, duplicate, inside & ~duplicate, rank, value)


def _as_index(got: torch.Tensor) -> torch.Tensor:
    """int64 indices; a NaN, infinite or fractional float index becomes _NOT_A_COLUMN."""
    if not got.is_floating_point():
        return got.to(torch.int64)
    whole = torch.isfinite(got) & (got == got.round()) & (got.abs() < 2.0 ** 62)
    return torch.where(whole, got, 0).to(torch.int64).masked_fill(~whole, _NOT_A_COLUMN)


def _later_occurrences(columns: torch.Tensor, named: torch.Tensor) -> torch.Tensor:
    """[rows, k] bool: slots holding a column an earlier slot of the row holds too (named slots only)."""
    ordered, order = columns.sort(dim=1, stable=True)  # equal columns stay in slot order
    repeat = torch.zeros_like(named)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return repeat.scatter(1, order, repeat.clone()) & named


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What a right row holds under the contract's padding convention ([rows] each): `need` picks, the
    `above` ones ranked over kth and need - above ranked equal to it, `pads` -1 slots and at most `fills`
    non-candidate columns."""

    need: torch.Tensor
    kth: torch.Tensor
    above: torch.Tensor
    pads: torch.Tensor
    fills: torch.Tensor

    @classmethod
    def of(cls, truth: TopkTruth, contract: TopkContract) -> _Rule:
        need, zero = truth.need, torch.zeros_like(truth.need)
        if contract.padding == TopkPadding.PAST_CANDIDATES:
            return cls(need, truth.kth, truth.above, truth.k - need, zero)
        if contract.padding == TopkPadding.OUTSIDE_COLUMNS:
            return cls(need, truth.kth, truth.above, zero, truth.k - need)
        # PAST_WINDOW: the window's -inf positions are its lowest values; they fill what candidates leave.
        window_need = truth.window.clamp(max=truth.k)
        short = window_need > truth.candidates
        return cls(window_need, torch.where(short, -math.inf, truth.kth), torch.where(short, truth.candidates,
                                                                                          truth.above),
                   truth.k - window_need, zero)


def _faults(s: _Slots, rule: _Rule, contract: TopkContract) -> dict[Verdict, torch.Tensor]:
    """[rows] bool per kind of failure, before the NaN rows are set aside."""
    minus_inf = s.pick & (s.rank == -math.inf)  # a pick of a -inf (or unranked NaN) position
    pads = s.pad.sum(dim=1)
    outside = s.outside.any(dim=1)
    if contract.padding == TopkPadding.OUTSIDE_COLUMNS:  # out-of-window columns are fills, up to rule.fills
        outside &= (s.outside | minus_inf).sum(dim=1) > rule.fills
        padding = pads > 0
    elif contract.padding == TopkPadding.PAST_CANDIDATES:  # -1 is promised wherever no candidate is
        padding = (pads != rule.pads) | minus_inf.any(dim=1)
    else:  # PAST_WINDOW: a -inf pick is a value like any other, only -1 past the window is promised
        padding = pads != rule.pads
    return {Verdict.FAIL_GARBAGE: s.garbage.any(dim=1), Verdict.FAIL_OUT_OF_WINDOW: outside,
            Verdict.FAIL_DUPLICATE: s.duplicate.any(dim=1), Verdict.FAIL_PADDING: padding,
            Verdict.FAIL_MISSING: _matched(s, rule) < rule.need,
            Verdict.FAIL_ORDER: _disordered(s) if contract.sorted else torch.zeros_like(padding)}


def _matched(s: _Slots, rule: _Rule) -> torch.Tensor:
    """[rows] picks that a right answer holds too: above kth (at most `above` exist), then equal to it (at
    most need - above count)."""
    kth = rule.kth[:, None]
    over = (s.pick & (s.rank > kth)).sum(dim=1)
    tied = (s.pick & (s.rank == kth) & (rule.need > 0)[:, None]).sum(dim=1)
    return over.clamp(max=rule.above) + torch.minimum(tied, rule.need - rule.above)


def _disordered(s: _Slots) -> torch.Tensor:
    """[rows] bool: a slot ranked above the slot before it, pads and fills outside the window counting as the
    lowest (so they go last)."""
    ranks = torch.where(s.pad | s.garbage | s.outside, -math.inf, s.rank)
    return (ranks[:, 1:] > ranks[:, :-1]).any(dim=1)


def _disordered_slots(s: _Slots, row: int) -> torch.Tensor:
    """[k] bool: the slots of `row` ranked above the slot before them (as _disordered ranks them)."""
    ranks = torch.where(s.pad[row] | s.garbage[row] | s.outside[row], -math.inf, s.rank[row])
    return torch.cat([torch.zeros(1, dtype=torch.bool, device=ranks.device), ranks[1:] > ranks[:-1]])


def _summarised(faults: dict[Verdict, torch.Tensor], s: _Slots, rule: _Rule, case: TopkCase,
                safety: torch.Tensor) -> TopkComparison:
    flags = torch.stack([faults[kind] for kind in KINDS])  # [kinds, rows], worst kind first
    failing = flags.any(dim=0)
    worst_kind = flags.to(torch.uint8).argmax(dim=0)  # the first (worst) kind each row shows
    tokens = _wrong_tokens(s, rule)
    rows, kinds, counts = (t.tolist() for t in (torch.nonzero(failing).flatten(), worst_kind[failing],
                                                 tokens[failing]))
    by_verdict: dict[Verdict, list[int]] = {}
    for row, kind in zip(rows, kinds, strict=True):
        by_verdict.setdefault(KINDS[kind], []).append(row)
    wrong = [(row, count) for row, kind, count in zip(rows, kinds, counts, strict=True)
             if KINDS[kind] != Verdict.FAIL_ORDER]
    symptoms = {kind: tuple(torch.nonzero(flags[i]).flatten().tolist()) for i, kind in enumerate(KINDS)}
    first = None if not rows else _mismatch(rows[0], KINDS[kinds[0]], s, rule, case)
    return TopkComparison(
        rows=case.rows, verdict=worst(list(by_verdict)), symptoms={k: v for k, v in symptoms.items() if v},
        rows_by_verdict={kind: tuple(found) for kind, found in by_verdict.items()},
        wrong_rows=tuple(row for row, _ in wrong), wrong_tokens=tuple(count for _, count in wrong),
        safety_rows=tuple(torch.nonzero(safety).flatten().tolist()), first_mismatch=first)


def _wrong_tokens(s: _Slots, rule: _Rule) -> torch.Tensor:
    """[rows] the multiset difference: tokens of a right set the row lacks, or where it lacks none, tokens it
    holds that no right set holds (a real index where -1 is promised)."""
    matched = _matched(s, rule)
    held = (~s.pad & ~s.garbage).sum(dim=1)
    return torch.maximum(rule.need - matched, (held - matched - rule.fills).clamp(min=0))


def _mismatch(row: int, kind: Verdict, s: _Slots, rule: _Rule, case: TopkCase) -> TopkMismatch:
    """The slot of `row` that shows `kind` first (-1 for a candidate no slot holds)."""
    kth = rule.kth[row]
    showing = {Verdict.FAIL_GARBAGE: s.garbage[row], Verdict.FAIL_OUT_OF_WINDOW: s.outside[row],
               Verdict.FAIL_DUPLICATE: s.duplicate[row],
               Verdict.FAIL_PADDING: s.pad[row] | (s.pick[row] & (s.rank[row] == -math.inf)),
               Verdict.FAIL_MISSING: (s.pick[row] & (s.rank[row] < kth)) | s.outside[row],
               Verdict.FAIL_ORDER: _disordered_slots(s, row)}[kind]
    slots = torch.nonzero(showing).flatten().tolist()
    slot = slots[0] if slots else -1
    index = None if slot < 0 else int(s.index[row, slot])
    value = None if slot < 0 or not (s.pick[row, slot] or s.outside[row, slot] or s.duplicate[row, slot]) \
        else float(s.value[row, slot])
    return TopkMismatch(row=row, slot=slot, kind=kind, index=index, value=value, kth=float(rank_to_value(kth)),
                        window=(int(case.starts[row]), int(case.ends[row])))
