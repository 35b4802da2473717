"""Why rows have the wrong -inf mask: the relation between a kernel's windows and the true ones, fitted.

difftest.engine.comparison records, for each wrong-mask row, the oracle's limit and the limit the kernel
behaved as if it had (its apparent limit: how many leading positions are not -inf). explain() fits
those apparent limits against each row's request b, draft row j, request length L_b and next_n, and
names every known relation that gives them exactly: "48/48 wrong" becomes "AITER's mirrored window".

Row r = b * next_n + j has the oracle limit o = max(L_b - next_n + j + 1, 0)
(docs/reference/encodings.md), so L_b is the limit of request b's last row. The relations, each a
prediction of every row's apparent limit (clamped to [0, max_model_len], as a row shows it):

    CONSTANT_OFFSET(k)         o + k
    PER_SEQUENCE_LENGTH        L_b: the MTP offset forgotten
    ROTATED_DRAFT_ROWS(s)      row (j + s) mod next_n's limit: a draft-row index off by s (s = 1 or next_n - 1,
                               one late or early); at next_n 2 the same rows as REVERSED_DRAFT_ROWS, listed
                               after it
    REVERSED_DRAFT_ROWS        max(L_b - j, 0): row j behaves as row next_n - 1 - j
    MTP_MIRRORED               L_b - j + 1: AITER 0.1.7's p <= L - j (row j behaves as row next_n - j);
                               row 0 may show L_b where L_b is a multiple of a declared tile (no chunk
                               holds p = L_b, so its phantom 0.0 is never written)
    TILE_TRUNCATED(t, down|up) o rounded down (up) to a multiple of the declared tile t
    SHIFTED_REQUEST(s)         request b - s's limits for request b's rows (s = 1: lengths read one
                               request late; |s| <= MAX_SHIFT); rows with no request b - s say nothing

A relation fits when it gives the apparent limit of every recorded wrong row and, for every row that
is right, the oracle's limit (or, where the tail is not checked, at least the oracle's: a longer
window is invisible there). Every fitting relation is kept: the first in the order above is the one
named, the others are `alternatives` (rows clamped at max_model_len cannot tell a window one long
from every row seeing L). Two readings come before any fit: every wrong row -inf from position 0 is
NO_WINDOW, and every wrong row finite to its end is TAIL_NOT_CLEANED (what also fits those clamped
rows listed after it). Without a fit: a constant offset on the wrong rows alone (`selective`: a
condition such as a block boundary picks the rows); then finite values past every wrong row's window
(TAIL_NOT_CLEANED, selective); else UNKNOWN, with how the limits differ.

Wrong values with every mask right are explained only by where their rows sit: AFTER_EMPTY_REQUEST when every
wrong-value row is in a request right after an empty one (DeepGEMM 2.8.1 scores it with the empty request's q
and weights, docs/findings/deepgemm-zero-length-request.md; `selective` where some such request is right: the
empty one must sit inside one SM's range); nothing otherwise.

The public shape (what the report renders, what fuzz keys its signatures on):

* Relation(pattern, offset, shift, tile, rounding): what the kernel computes, with its parameters; the
  same bug gives the same Relation on every case whose rows tell the relations apart, whatever the
  case's lengths: key on it (a case whose rows cannot lists the bug's relation among `alternatives`).
* Explanation: the Relation and the evidence of one case (which varies from case to case):
  `selective`, `explained` of `rows` recorded wrong rows, `next_n`, `draft_rows` (the draft positions j
  of the wrong rows), an `example` row, `right_windows`, `holes`, `differences` and `alternatives`.
* Pattern and Rounding: the enums inside them; their values are what JSON reports hold.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from difftest.core.errors import SpecError
from difftest.core.schema import (
    MAX_BATCH,
    MAX_MODEL_LEN,
    MAX_NEXT_N,
    MAX_TEXT,
    Bool,
    Count,
    Int,
    Member,
    Record,
    RowIndex,
    Rule,
    TupleOf,
    bound_text,
    shown,
)

MaskLimit = tuple[int, int, int | None]  # (row, the oracle's limit, the kernel's apparent limit or None)
# Wrong-mask rows whose limits a Comparison records: enough for every pattern this module knows (a case's
# requests repeat them), few enough that a JSON report of a 2^21-row case stays small.
MASK_LIMITS = 256
DIFFERENCES_KEPT = 8  # distinct kernel - oracle limits an Explanation keeps, the most common first
_SHIFT_WITNESSES = 4  # recorded rows whose limit is looked up among the other requests' for a shift
_SHIFTS_TRIED = 16  # the nearest shifts those rows suggest
# The farthest request SHIFTED_REQUEST looks at: a row with a far request's lengths is scrambled, not shifted.
MAX_SHIFT = 64


class Pattern(str, enum.Enum):
    """The kinds of relation between a kernel's windows and the oracle's (its values are JSON's)."""

    NO_WINDOW = "no-window"  # every wrong row is -inf from position 0
    CONSTANT_OFFSET = "constant-offset"  # o + offset
    PER_SEQUENCE_LENGTH = "per-sequence-length"  # every row of request b sees L_b
    ROTATED_DRAFT_ROWS = "rotated-draft-rows"  # row j sees row (j + shift) mod next_n's window: j off by one
    REVERSED_DRAFT_ROWS = "reversed-draft-rows"  # row j sees L_b - j: row next_n - 1 - j's window
    MTP_MIRRORED = "mtp-mirrored"  # row j sees L_b - j + 1 (AITER's p <= L - j)
    TILE_TRUNCATED = "tile-truncated"  # o rounded down or up to a multiple of a declared tile
    SHIFTED_REQUEST = "shifted-request"  # request b's rows see request b - shift's limits
    TAIL_NOT_CLEANED = "tail-not-cleaned"  # finite values past the window under tail-neg-inf
    AFTER_EMPTY_REQUEST = "after-empty-request"  # wrong values on the rows of the requests after empty ones
    UNKNOWN = "unknown"


# Pattern values older reports hold, and what they read as now.
LEGACY_PATTERNS = {"shifted-by-one-request": Pattern.SHIFTED_REQUEST}
LEGACY_TEXT = "a relation, or the pattern of an older report (one of the two)"


class Rounding(str, enum.Enum):
    """Which way TILE_TRUNCATED rounds a window: DOWN drops the partial last tile, UP keeps it whole."""

    DOWN = "down"
    UP = "up"


@dataclasses.dataclass(frozen=True)
class Relation(Record):
    """What the kernel computes for its windows: a Pattern and the parameters it takes (None elsewhere)."""

    pattern: Member(Pattern)
    offset: Int(-MAX_MODEL_LEN, MAX_MODEL_LEN) | None = None  # CONSTANT_OFFSET: kernel limit - oracle limit
    # SHIFTED_REQUEST: request b's rows see request b - shift's limits; ROTATED_DRAFT_ROWS: row j sees row
    # (j + shift) mod next_n's
    shift: Int(-2 * MAX_BATCH, 2 * MAX_BATCH) | None = None
    tile: Int(2, MAX_MODEL_LEN) | None = None  # TILE_TRUNCATED: the declared tile the windows are rounded to
    rounding: Member(Rounding) | None = None  # TILE_TRUNCATED


@dataclasses.dataclass(frozen=True)
class Example(Record):
    """One recorded wrong row, placed in its request when next_n is known."""

    row: RowIndex
    oracle: Int(0, MAX_MODEL_LEN)
    kernel: Int(0, MAX_MODEL_LEN) | None  # its apparent limit; None when its visible positions are no prefix
    request: Int(0, 2 * MAX_BATCH) | None = None
    draft_row: Int(0, MAX_NEXT_N - 1) | None = None  # j
    length: Int(0, MAX_MODEL_LEN) | None = None  # L_b


def _difference(value: object) -> bool:
    """[kernel - oracle limit or null, recorded rows]."""
    return (type(value) is list and len(value) == 2
            and (value[0] is None or (type(value[0]) is int and -MAX_MODEL_LEN <= value[0] <= MAX_MODEL_LEN))
            and type(value[1]) is int and 1 <= value[1] <= MASK_LIMITS)


DraftRows = TupleOf(Int(0, MAX_NEXT_N - 1), MAX_NEXT_N, f"a list of at most {MAX_NEXT_N} draft rows")
Differences = TupleOf(Rule(_difference, "[kernel - oracle limit or null, rows]", tuple).type(tuple), DIFFERENCES_KEPT,
                      f"a list of at most {DIFFERENCES_KEPT} [kernel - oracle limit or null, rows]")
Relations = TupleOf(Relation, len(Pattern) * 8, "a list of Relation objects")


@dataclasses.dataclass(frozen=True)
class Explanation(Record):
    """The relation a case's wrong windows follow and the evidence for it (see the module docstring)."""

    relation: Relation
    explained: Count  # recorded wrong rows whose apparent limit the relation gives
    rows: Int(0, MASK_LIMITS)  # wrong rows with a recorded limit (Comparison.mask_limits)
    selective: Bool = False  # it holds on the wrong rows only: other rows it would change are right
    next_n: Int(1, MAX_NEXT_N) | None = None
    draft_rows: DraftRows = ()  # the draft positions j with a wrong row, when next_n is known
    example: Example | None = None
    right_windows: Count = 0  # rows with a non-empty window whose mask is right
    # recorded wrong rows whose visible positions are no prefix (-inf between values)
    holes: Int(0, MASK_LIMITS) = 0
    # (kernel - oracle limit, or None for no prefix; recorded rows), the DIFFERENCES_KEPT most common
    differences: Differences = ()
    alternatives: Relations = ()  # other relations that fit as exactly

    @property
    def pattern(self) -> Pattern:
        """The named relation's pattern."""
        return self.relation.pattern

    @classmethod
    def upgraded(cls, data: object) -> object:
        """An explanation an older report wrote (a pattern, one of LEGACY_PATTERNS' too, and its description;
        no relation) as its pattern's relation, without parameters (the description is not read back)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        pattern, description = data.pop("pattern", None), data.pop("description", None)
        if (data.get("relation") is None) == (pattern is None):
            raise SpecError("relation", None if pattern is None else "both", LEGACY_TEXT)
        if pattern is not None:
            values = [p.value for p in Pattern] + list(LEGACY_PATTERNS)
            if pattern not in values:
                raise SpecError("pattern", shown(pattern), f"one of {values}")
            if description is not None and not (type(description) is str and len(description) <= MAX_TEXT):
                raise SpecError("description", shown(description),
                                f"a string of at most {bound_text(MAX_TEXT)} characters, or null")
            data["relation"] = {"pattern": getattr(LEGACY_PATTERNS.get(pattern), "value", pattern)}
        return data


def explain(mask_limits: Sequence[MaskLimit], next_n: int | None, row_lens: torch.Tensor | Sequence[int], *,
            width: int | None = None, wrong_rows: Iterable[int] | None = None, tail_checked: bool = True,
            tiles: Sequence[int] = (), value_rows: Sequence[int] = ()) -> Explanation | None:
    """The relation that fits every wrong row of `mask_limits` (UNKNOWN when none does); without wrong masks,
    where the wrong-value rows `value_rows` sit (AFTER_EMPTY_REQUEST, or None: no pattern of values is known).

    row_lens (rows,) are the oracle's limits; next_n None (the case's structure unknown) tries only the
    relations that need no requests. `width` (max_model_len) clamps predictions as the row does;
    `wrong_rows` lists every wrong-mask row (the rows past the recorded ones included), so a relation
    is checked against the right rows too; `tail_checked` is False under tail-unspecified; `tiles` are
    the key-position tiles the backend declares (Contract.tiles).
    """
    if not mask_limits:
        return _after_empty(list(value_rows), next_n, row_lens)
    fit = _Fit.of(list(mask_limits), next_n, row_lens, width, wrong_rows, tail_checked, tiles)
    return fit.explanation(*_relations(fit))


# --------------------------------------------------------------------------- the data fitted

@dataclasses.dataclass(frozen=True)
class _Rows:
    """Some rows and what a relation reads of each: the oracle's limit and, when next_n is known, the
    request b, the draft row j and the request's length L_b (None otherwise)."""

    index: torch.Tensor
    oracle: torch.Tensor
    request: torch.Tensor | None = None
    j: torch.Tensor | None = None
    length: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class _Fit:
    """What a relation is fitted to: the recorded wrong rows, every row's oracle limit, which rows are right."""

    limits: list[MaskLimit]
    lens: torch.Tensor  # (rows,) int64 oracle limits
    right: torch.Tensor  # (rows,) bool: the row's mask is right
    next_n: int | None  # None when unknown or when it does not divide the rows
    width: int | None
    tail_checked: bool
    tiles: tuple[int, ...]

    @classmethod
    def of(cls, limits: list[MaskLimit], next_n: int | None, row_lens: torch.Tensor | Sequence[int],
           width: int | None, wrong_rows: Iterable[int] | None, tail_checked: bool, tiles: Sequence[int]) -> _Fit:
        lens = torch.as_tensor(row_lens, dtype=torch.int64).reshape(-1).cpu()
        wrong = sorted(set(wrong_rows) if wrong_rows is not None else {row for row, _, _ in limits})
        right = torch.ones(len(lens), dtype=torch.bool)
        right[torch.tensor(wrong, dtype=torch.int64)] = False
        tiles = tuple(sorted({t for t in tiles if t > 1}))
        known_n = next_n if next_n and len(lens) % next_n == 0 else None
        return cls(limits, lens, right, known_n, width, tail_checked, tiles)

    @property
    def requests(self) -> int:
        """Requests in the case; 0 when next_n is unknown."""
        return len(self.lens) // self.next_n if self.next_n else 0

    @functools.cached_property
    def recorded(self) -> tuple[_Rows, torch.Tensor]:
        """The recorded wrong rows and the apparent limit each shows (-1 for no prefix)."""
        shown = torch.tensor([-1 if a is None else a for _, _, a in self.limits])
        return self.rows(torch.tensor([row for row, _, _ in self.limits])), shown

    @functools.cached_property
    def every_row(self) -> _Rows:
        """Every row, made by slicing rather than gathering (a 2^21-row gather costs tens of milliseconds)."""
        if self.next_n is None:
            return _Rows(torch.arange(len(self.lens)), self.lens)
        index = torch.arange(len(self.lens))
        length = self.lens.reshape(-1, self.next_n)[:, -1].repeat_interleave(self.next_n)
        return _Rows(index, self.lens, index // self.next_n, index % self.next_n, length)

    def rows(self, index: torch.Tensor) -> _Rows:
        """`index`'s rows. The last row of request b sees all L_b tokens: max(L_b - n + (n - 1) + 1, 0) = L_b."""
        if self.next_n is None:
            return _Rows(index, self.lens[index])
        request, j = index // self.next_n, index % self.next_n
        return _Rows(index, self.lens[index], request, j, self.lens[request * self.next_n + self.next_n - 1])

    def explanation(self, relations: list[Relation], selective: bool, free: torch.Tensor | None = None) -> Explanation:
        """The Explanation naming relations[0], the others as alternatives; its example is a recorded row
        with an apparent limit that the named relation says something about (`free`: the recorded rows it
        does not), where there is one."""
        known = [limit for i, limit in enumerate(self.limits) if limit[2] is not None and (free is None or not free[i])]
        differences = Counter(None if a is None else a - o for _, o, a in self.limits)
        draft_rows = (torch.nonzero(~self.right).flatten() % self.next_n).unique() if self.next_n else torch.zeros(0)
        return Explanation(
            relations[0], 0 if relations[0].pattern == Pattern.UNKNOWN else len(self.limits), len(self.limits),
            selective=selective, next_n=self.next_n, draft_rows=tuple(draft_rows.tolist()),
            example=self._example((known or self.limits)[0]),
            right_windows=int((self.right & (self.lens > 0)).sum()), holes=differences[None],
            differences=tuple(differences.most_common(DIFFERENCES_KEPT)), alternatives=tuple(relations[1:]))

    def _example(self, limit: MaskLimit) -> Example:
        row, oracle, apparent = limit
        if self.next_n is None:
            return Example(row, oracle, apparent)
        request, j = divmod(row, self.next_n)
        return Example(row, oracle, apparent, request, j, int(self.lens[request * self.next_n + self.next_n - 1]))


# --------------------------------------------------------------------------- fitting

@dataclasses.dataclass(frozen=True)
class _Prediction:
    """What a relation says some rows show."""

    shown: torch.Tensor  # the apparent limit of each row
    also: torch.Tensor | None = None  # a second limit a row may show
    free: torch.Tensor | None = None  # rows the relation says nothing about (no request to shift from)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """A relation and its prediction for any rows: tried on the recorded rows first, on every row only when
    it gives those (predicting all 2^21 rows of the largest cases is the costly part)."""

    relation: Relation
    predict: Callable[[_Rows], _Prediction]


def _relations(fit: _Fit) -> tuple[list[Relation], bool, torch.Tensor | None]:
    """Every relation that fits, the named one first; whether it holds on the wrong rows alone; the recorded
    rows it says nothing about."""
    limits = fit.limits
    if all(apparent == 0 for _, _, apparent in limits):
        return [Relation(Pattern.NO_WINDOW)], bool((fit.right & (fit.lens > 0)).any()), None
    fitting = [(c, free) for c in _candidates(fit) if (free := _fitted_free(c, fit)) is not None]
    width, known = fit.width, [(o, a) for _, o, a in limits if a is not None]
    if width is not None and known and all(a == width > o for o, a in known):
        # Values to the end of every wrong row: the plainest reading. What else gives rows clamped at the
        # width (a window a few positions long, every row seeing L) is listed after it.
        tail = Relation(Pattern.TAIL_NOT_CLEANED)
        return [tail, *(c.relation for c, _ in fitting)], bool((fit.right & (fit.lens < width)).any()), None
    if fitting:
        return [c.relation for c, _ in fitting], False, fitting[0][1]
    loose = _loose_offset(limits)
    if loose is not None:
        return [loose], True, None
    if fit.tail_checked and known and all(a > o for o, a in known):  # holes alone may be inside the window
        return [Relation(Pattern.TAIL_NOT_CLEANED)], True, None
    return [Relation(Pattern.UNKNOWN)], False, None


def _candidates(fit: _Fit) -> Iterator[_Candidate]:
    """Each relation worth trying on this case, in the order of the module docstring."""
    yield from _offsets(fit)
    if fit.next_n is not None and fit.next_n > 1:
        yield _Candidate(Relation(Pattern.PER_SEQUENCE_LENGTH), lambda r: _Prediction(r.length))
        for shift in sorted({1, fit.next_n - 1}):
            yield _Candidate(Relation(Pattern.ROTATED_DRAFT_ROWS, shift=shift),
                             functools.partial(_rotated, next_n=fit.next_n, shift=shift))
        # Row j with row next_n - 1 - j's window: max(L - next_n + (next_n - 1 - j) + 1, 0) = max(L - j, 0).
        yield _Candidate(Relation(Pattern.REVERSED_DRAFT_ROWS), lambda r: _Prediction(r.length - r.j))
        yield _Candidate(Relation(Pattern.MTP_MIRRORED), functools.partial(_mirrored, tiles=fit.tiles))
    for tile in fit.tiles:
        yield from (_Candidate(Relation(Pattern.TILE_TRUNCATED, tile=tile, rounding=rounding),
                               functools.partial(_rounded, tile=tile, rounding=rounding)) for rounding in Rounding)
    if fit.requests > 1:
        yield from (_Candidate(Relation(Pattern.SHIFTED_REQUEST, shift=shift), functools.partial(_shifted, fit, shift))
                    for shift in _shifts(fit))


def _offsets(fit: _Fit) -> Iterator[_Candidate]:
    """A constant offset k for each kernel - oracle difference of the recorded rows, the most common first (a
    clamped row shows another: -3 on a row of limit 2 shows -2). Also accepted: k applied before the
    oracle's clamp at 0, as a kernel computing L - next_n + j + 1 + k does on rows with fewer than next_n keys."""
    def predict(rows: _Rows, offset: int) -> _Prediction:
        if rows.length is None or rows.j is None or fit.next_n is None:
            return _Prediction(rows.oracle + offset)
        return _Prediction(rows.oracle + offset, rows.length - fit.next_n + rows.j + 1 + offset)

    differences = Counter(a - o for _, o, a in fit.limits if a is not None)
    for offset, _ in differences.most_common():
        yield _Candidate(Relation(Pattern.CONSTANT_OFFSET, offset=offset), functools.partial(predict, offset=offset))


def _mirrored(rows: _Rows, tiles: tuple[int, ...]) -> _Prediction:
    """AITER's window p <= L - j: L - j + 1 positions. At j = 0 the last of them is p = L, whose key
    load is masked: its phantom 0.0 is written only when a processed chunk holds p = L, i.e. when L
    is no multiple of the kernel's tile (docs/findings/aiter-triton-mask.md). So row 0 may show L,
    but only where L is a multiple of a declared tile: anywhere else L at row 0 is another relation."""
    assert rows.length is not None and rows.j is not None
    shown = rows.length - rows.j + 1
    if not tiles:
        return _Prediction(shown)
    whole = torch.stack([rows.length % tile == 0 for tile in tiles]).any(dim=0)
    return _Prediction(shown, torch.where((rows.j == 0) & whole, rows.length, shown))


def _rotated(rows: _Rows, next_n: int, shift: int) -> _Prediction:
    """Row j with row (j + shift) mod next_n's limit: max(L - next_n + ((j + shift) mod next_n) + 1, 0)."""
    assert rows.length is not None and rows.j is not None
    return _Prediction(rows.length - next_n + (rows.j + shift) % next_n + 1)


def _rounded(rows: _Rows, tile: int, rounding: Rounding) -> _Prediction:
    """Each window rounded to a multiple of `tile`: down (the partial last tile dropped) or up (stored whole)."""
    o = rows.oracle
    return _Prediction(o // tile * tile if rounding == Rounding.DOWN else (o + tile - 1) // tile * tile)


def _shifts(fit: _Fit) -> list[int]:
    """The shifts s (request b's rows with request b - s's limits), |s| <= MAX_SHIFT, that a few recorded rows
    point at: the requests near b whose row j has the limit the kernel showed, the nearest first (s > 0
    before -s)."""
    assert fit.next_n is not None
    table = fit.lens.reshape(fit.requests, fit.next_n)
    shifts: set[int] = set()
    for row, _, apparent in [limit for limit in fit.limits if limit[2] is not None][:_SHIFT_WITNESSES]:
        b, j = divmod(row, fit.next_n)
        first = max(0, b - MAX_SHIFT)
        sources = first + torch.nonzero(table[first:b + MAX_SHIFT + 1, j] == apparent).flatten()
        shifts.update(s for s in (b - sources).tolist() if s)
    return sorted(shifts, key=lambda s: (abs(s), -s))[:_SHIFTS_TRIED]


def _shifted(fit: _Fit, shift: int, rows: _Rows) -> _Prediction:
    """Request b's rows with request b - shift's limits; the rows of requests without one are free."""
    assert rows.request is not None and rows.j is not None and fit.next_n is not None
    source = rows.request - shift
    outside = (source < 0) | (source >= fit.requests)
    return _Prediction(fit.lens[source.clamp(0, fit.requests - 1) * fit.next_n + rows.j], free=outside)


def _predicted(candidate: _Candidate, rows: _Rows, width: int | None) -> _Prediction:
    """The candidate's prediction for `rows` as a row can show it: no fewer than 0 positions, no more than
    the row has."""
    p = candidate.predict(rows)
    also = None if p.also is None else p.also.clamp(min=0, max=width)
    return _Prediction(p.shown.clamp(min=0, max=width), also, p.free)


def _fitted_free(candidate: _Candidate, fit: _Fit) -> torch.Tensor | None:
    """Which recorded rows `candidate` says nothing about, when it gives every other recorded wrong row's
    apparent limit and leaves every right row right; None when it does not fit.

    Rows it says nothing about (free) count only when the rows it does say something about outnumber
    them: a shift cannot be seen in a request that has no source."""
    if any(a is None for _, _, a in fit.limits):
        return None
    recorded, shown = fit.recorded
    p = _predicted(candidate, recorded, fit.width)
    free = p.free if p.free is not None else torch.zeros(len(shown), dtype=torch.bool)
    fixed = ~free
    if int(fixed.sum()) < int(free.sum()) or not _accepts(p, shown)[fixed].all():
        return None
    return free if _leaves_right_rows_right(candidate, fit) else None


def _accepts(p: _Prediction, shown: torch.Tensor) -> torch.Tensor:
    ok = p.shown == shown
    return ok if p.also is None else ok | (p.also == shown)


def _leaves_right_rows_right(candidate: _Candidate, fit: _Fit) -> bool:
    """Whether every row that is right is right under the candidate too (vectorised over the rows)."""
    p = _predicted(candidate, fit.every_row, fit.width)
    ok = _accepts(p, fit.lens)
    if not fit.tail_checked:  # a window longer than the oracle's goes unseen when the tail is not checked
        ok |= p.shown >= fit.lens
    if p.free is not None:
        ok |= p.free
    return bool((ok | ~fit.right).all())


def _loose_offset(limits: list[MaskLimit]) -> Relation | None:
    """A constant offset on the wrong rows alone: something picks the rows (a block boundary, say)."""
    offsets = {None if a is None else a - o for _, o, a in limits}
    if len(offsets) != 1 or None in offsets:
        return None
    (offset,) = offsets
    return Relation(Pattern.CONSTANT_OFFSET, offset=offset)


def _after_empty(value_rows: list[int], next_n: int | None,
                 row_lens: torch.Tensor | Sequence[int]) -> Explanation | None:
    """AFTER_EMPTY_REQUEST when every wrong-value row lies in a request (with keys) right after an empty one;
    None otherwise, and when the case's requests are unknown."""
    lens = torch.as_tensor(row_lens, dtype=torch.int64).reshape(-1).cpu()
    if not value_rows or not next_n or len(lens) % next_n:
        return None
    length = lens.reshape(-1, next_n)[:, -1]  # L_b: the limit of request b's last row
    after = torch.zeros_like(length, dtype=torch.bool)
    after[1:] = (length[:-1] == 0) & (length[1:] > 0)
    requests = torch.tensor(value_rows, dtype=torch.int64) // next_n
    if not after[requests].all():
        return None
    recorded = min(len(value_rows), MASK_LIMITS)
    draft_rows = (torch.tensor(value_rows) % next_n).unique().tolist()
    wrong = torch.zeros_like(lens, dtype=torch.bool)
    wrong[torch.tensor(value_rows, dtype=torch.int64)] = True
    # selective: some request after an empty one is right (DeepGEMM's needs the empty one inside an SM's range)
    return Explanation(Relation(Pattern.AFTER_EMPTY_REQUEST), recorded, recorded,
                       selective=len(set(requests.tolist())) < int(after.sum()), next_n=next_n,
                       draft_rows=tuple(draft_rows), right_windows=int(((lens > 0) & ~wrong).sum()))
