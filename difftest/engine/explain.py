"""Why rows have the wrong -inf mask: the pattern behind a failing case's windows, named.

difftest.engine.comparison records, for each wrong-mask row, the oracle's limit and the limit the kernel
behaved as if it had (its apparent limit: how many leading positions are not -inf). explain() tries
the known ways a kernel gets its windows wrong against those rows and names the first that fits:
"48/48 wrong" becomes "the MTP window mirrored".

Row r = b * next_n + j has the oracle limit max(L_b - next_n + j + 1, 0) (docs/reference/encodings.md),
so L_b is the limit of request b's last row. A pattern predicts every row's apparent limit. It fits
when it gives the apparent limit of every recorded wrong row and, for every row that is right, the
oracle's limit (or, where the tail is not checked, at least the oracle's: a longer window is invisible
there). CONSTANT_OFFSET and NO_WINDOW are also named when they fit the wrong rows alone: a planted
condition (a block boundary, a zero-length request) picks the rows, the offset is still the cause.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

MaskLimit = tuple[int, int, int | None]  # (row, the oracle's limit, the kernel's apparent limit or None)


class Pattern(str, enum.Enum):
    """The known shapes of wrong windows, tried in this order (the most specific first)."""

    NO_WINDOW = "no-window"  # every wrong row is -inf from position 0
    MTP_MIRRORED = "mtp-mirrored"  # row j sees L - j + 1 positions (AITER's p <= L - j)
    PER_SEQUENCE_LENGTH = "per-sequence-length"  # every row of request b sees L_b
    CONSTANT_OFFSET = "constant-offset"  # apparent = oracle + k on every wrong row
    SHIFTED_BY_ONE_REQUEST = "shifted-by-one-request"  # request b's rows get request b - 1's (or b + 1's) limits
    TAIL_NOT_CLEANED = "tail-not-cleaned"  # finite values past the window under tail-neg-inf
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The pattern behind a case's wrong-mask rows, in one line with its numbers."""

    pattern: Pattern
    description: str
    explained: int  # recorded wrong rows whose apparent limit the pattern gives
    rows: int  # wrong rows with a recorded limit (Comparison.mask_limits)

    def summary(self) -> str:
        """'(16 of 16 wrong rows) MTP window mirrored: ...'."""
        return f"({self.explained} of {self.rows} wrong rows) {self.description}"


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Per row: its request b, draft position j, the request's length L_b and its oracle limit."""

    request: torch.Tensor
    j: torch.Tensor
    length: torch.Tensor
    oracle: torch.Tensor
    next_n: int
    requests: int


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """A pattern's prediction of every row's apparent limit."""

    pattern: Pattern
    predicted: torch.Tensor
    words: str  # the description, before the example row
    also: torch.Tensor | None = None  # a second accepted limit per row
    free: torch.Tensor | None = None  # rows where the pattern says nothing (no request to shift from)


def explain(mask_limits: Sequence[MaskLimit], next_n: int | None, row_lens: torch.Tensor | Sequence[int], *,
            width: int | None = None, wrong_rows: Iterable[int] | None = None,
            tail_checked: bool = True) -> Explanation | None:
    """The pattern that fits every wrong row of `mask_limits`, UNKNOWN when none does, None without rows.

    row_lens (rows,) are the oracle's limits; next_n None (the case's structure unknown) tries only the
    patterns that need no requests. `width` (max_model_len) clamps predictions as the row does;
    `wrong_rows` lists every wrong-mask row (the rows past the recorded ones included), so a pattern
    can be checked against the right rows too; `tail_checked` is False under tail-unspecified.
    """
    if not mask_limits:
        return None
    lens = torch.as_tensor(row_lens, dtype=torch.int64).reshape(-1).cpu()
    limits = list(mask_limits)
    wrong = set(wrong_rows) if wrong_rows is not None else {row for row, _, _ in limits}
    if all(apparent == 0 for _, _, apparent in limits):
        return _no_window(limits, lens, wrong)
    if width is not None and all(a is None or a == width > o for _, o, a in limits):
        # Values to the end of every wrong row: clamped at the width, any prediction past it would "fit".
        return _tail_not_cleaned(limits, tail_checked)
    layout = _layout(lens, next_n)
    for candidate in _candidates(layout, lens, limits, width):
        explained = _explained(candidate, limits)
        if explained == len(limits) and _fits_right_rows(candidate, lens, wrong, tail_checked):
            return Explanation(candidate.pattern, f"{candidate.words}; {_example(limits[0], layout)}",
                               explained, len(limits))
    return _loose_offset(limits, wrong, len(lens)) or _tail_not_cleaned(limits, tail_checked) \
        or _unknown(limits)


def _layout(lens: torch.Tensor, next_n: int | None) -> _Layout | None:
    """The requests of the rows; None when next_n is unknown or does not divide the rows."""
    if not next_n or len(lens) % next_n:
        return None
    rows = torch.arange(len(lens))
    # The last row of request b sees all L_b tokens: max(L_b - next_n + next_n - 1 + 1, 0) = L_b.
    length = lens.reshape(-1, next_n)[:, -1].repeat_interleave(next_n)
    return _Layout(rows // next_n, rows % next_n, length, lens, next_n, len(lens) // next_n)


def _candidates(layout: _Layout | None, lens: torch.Tensor, limits: list[MaskLimit],
                width: int | None) -> list[_Candidate]:
    """Every pattern that applies to this case, each row's prediction clamped to [0, width]."""
    found = []
    if layout is not None and layout.next_n > 1:
        found += [_mirrored(layout), _per_sequence(layout)]
    offset = next((a - o for _, o, a in limits if a is not None and a != o), None)
    if offset is not None:  # before a shift: lengths 1, 2, 3, ... shifted by one request are one short too
        found.append(_Candidate(Pattern.CONSTANT_OFFSET, lens + offset, _offset_words(offset)))
    if layout is not None and layout.requests > 1:
        found += _shifted(layout)
    return [_clamped(c, width) for c in found]


def _mirrored(layout: _Layout) -> _Candidate:
    """AITER's window p <= L - j: L - j + 1 positions. At j = 0 the last of them is p = L, whose
    key load is masked: its phantom 0.0 is written only when a processed chunk holds p = L, so
    L is accepted there too (docs/findings/aiter-triton-mask.md)."""
    predicted = layout.length - layout.j + 1
    also = torch.where(layout.j == 0, layout.length, predicted)
    return _Candidate(Pattern.MTP_MIRRORED, predicted,
                      f"MTP window mirrored: row j of a request sees L - j + 1 positions instead of "
                      f"L - next_n + j + 1 (next_n {layout.next_n}: row j behaves as row next_n - j)", also)


def _per_sequence(layout: _Layout) -> _Candidate:
    return _Candidate(Pattern.PER_SEQUENCE_LENGTH, layout.length,
                      f"per-sequence length used for every row: each row of a request sees L, the "
                      f"sequence's length, instead of L - next_n + j + 1 (next_n {layout.next_n}: the MTP "
                      f"offset forgotten)")


def _shifted(layout: _Layout) -> list[_Candidate]:
    """Request b's rows with request b - 1's limits (lengths read one request late), and b + 1's."""
    table = layout.oracle.reshape(layout.requests, layout.next_n)
    late = torch.cat([table[:1], table[:-1]]).reshape(-1)
    early = torch.cat([table[1:], table[-1:]]).reshape(-1)
    return [_Candidate(Pattern.SHIFTED_BY_ONE_REQUEST, late, "rows shifted by one request: the rows of request "
                       "b see request b - 1's limits", free=layout.request == 0),
            _Candidate(Pattern.SHIFTED_BY_ONE_REQUEST, early, "rows shifted by one request: the rows of request "
                       "b see request b + 1's limits", free=layout.request == layout.requests - 1)]


def _offset_words(offset: int) -> str:
    named = {-1: " (window one short)", 1: " (window one long)"}.get(offset, "")
    return f"constant offset {offset:+d}: every row's window is the oracle's {offset:+d}{named}"


def _clamped(candidate: _Candidate, width: int | None) -> _Candidate:
    """Predictions as a row can show them: no fewer than 0 positions, no more than the row has."""
    def clamp(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.clamp(min=0, max=width)
    return dataclasses.replace(candidate, predicted=clamp(candidate.predicted), also=clamp(candidate.also))


def _accepts(candidate: _Candidate, row: int, limit: int) -> bool:
    also = candidate.also
    return int(candidate.predicted[row]) == limit or (also is not None and int(also[row]) == limit)


def _explained(candidate: _Candidate, limits: list[MaskLimit]) -> int:
    """Recorded wrong rows the candidate gives. Rows it says nothing about (free) count only when it
    gives every other row, and at least one: a shift cannot be seen in request 0 alone."""
    known = [(row, a) for row, _, a in limits if a is not None]
    free = {row for row, _ in known if candidate.free is not None and bool(candidate.free[row])}
    fixed = [(row, a) for row, a in known if row not in free]
    hits = sum(_accepts(candidate, row, a) for row, a in fixed)
    return hits + len(free) if fixed and hits == len(fixed) else hits


def _fits_right_rows(candidate: _Candidate, lens: torch.Tensor, wrong: set[int], tail_checked: bool) -> bool:
    """Whether every row that is right is right under the candidate too (vectorised over the rows)."""
    right = torch.ones(len(lens), dtype=torch.bool)
    right[torch.tensor(sorted(wrong), dtype=torch.int64)] = False
    ok = candidate.predicted == lens
    if candidate.also is not None:
        ok |= candidate.also == lens
    if not tail_checked:  # a window longer than the oracle's goes unseen when the tail is not checked
        ok |= candidate.predicted >= lens
    if candidate.free is not None:
        ok |= candidate.free
    return bool((ok | ~right).all())


def _example(limit: MaskLimit, layout: _Layout | None) -> str:
    row, oracle, apparent = limit
    if layout is None:
        return f"e.g. row {row}: oracle limit {oracle}, kernel {apparent}"
    b, j, length = int(layout.request[row]), int(layout.j[row]), int(layout.length[row])
    return f"e.g. row {row} (request {b}, j {j}, L {length}): oracle limit {oracle}, kernel {apparent}"


def _no_window(limits: list[MaskLimit], lens: torch.Tensor, wrong: set[int]) -> Explanation:
    windowed = lens > 0
    windowed[torch.tensor(sorted(wrong), dtype=torch.int64)] = False
    others = int(windowed.sum())
    tail = f"; {others} other rows with a window are right" if others else ""
    return Explanation(Pattern.NO_WINDOW, f"no window: every wrong row is -inf from position 0{tail}",
                       len(limits), len(limits))


def _loose_offset(limits: list[MaskLimit], wrong: set[int], rows: int) -> Explanation | None:
    """A constant offset on the wrong rows alone: something picks the rows (a block boundary, say)."""
    offsets = {None if a is None else a - o for _, o, a in limits}
    if len(offsets) != 1 or None in offsets:
        return None
    (offset,) = offsets
    assert offset is not None
    words = _offset_words(offset).replace("every row's", "every wrong row's")
    return Explanation(Pattern.CONSTANT_OFFSET, f"{words}; the other {rows - len(wrong)} rows are right, so "
                       f"a condition picks the rows; {_example(limits[0], None)}", len(limits), len(limits))


def _tail_not_cleaned(limits: list[MaskLimit], tail_checked: bool) -> Explanation | None:
    """Finite values past every wrong row's window (or a window with holes): the tail left uncleaned."""
    if not tail_checked or not all(a is None or a > o for _, o, a in limits):
        return None
    holes = sum(a is None for _, _, a in limits)
    return Explanation(Pattern.TAIL_NOT_CLEANED, f"tail not cleaned: finite values past the oracle's window "
                       f"on every wrong row ({holes} of them with -inf between values)", len(limits), len(limits))


def _unknown(limits: list[MaskLimit]) -> Explanation:
    counts = Counter("not a prefix (holes)" if a is None else f"{a - o:+d}" for _, o, a in limits)
    shown = ", ".join(f"{what} on {n}" for what, n in counts.most_common(4))
    more = ", ..." if len(counts) > 4 else ""
    return Explanation(Pattern.UNKNOWN, f"no known pattern fits: kernel - oracle limit is {shown}{more}",
                       0, len(limits))
