"""Row-by-row comparison of a backend's logits with the oracle's, under the backend's contract."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import torch

from difftest.core.contract import DEFAULT_TOPK, Contract
from difftest.core.errors import SpecError
from difftest.core.kinds import MaskConvention
from difftest.core.poison import is_poison
from difftest.core.schema import (
    AS_JSON_FLOAT,
    MAX_MODEL_LEN,
    MAX_ROWS,
    Count,
    Int,
    JsonFloat,
    Member,
    NonNegative,
    Record,
    RowIndex,
    Rows,
    Rule,
    Text,
    TupleOf,
)
from difftest.core.verdict import Verdict, worst
from difftest.engine.explain import MASK_LIMITS, Explanation, MaskLimit, explain

CHUNK_ELEMENTS = 1 << 25  # logits compared at once: a few float64 copies of this many stay under 2 GB
_KINDS = (Verdict.FAIL_UNWRITTEN, Verdict.FAIL_NAN, Verdict.FAIL_MASK, Verdict.FAIL_VALUE)
STRIP_SPAN = 12  # positions the mask strip shows on each side of a boundary
STRIP_LEGEND = "v value, - -inf, N NaN, ? poison, + +inf; | where the oracle's window ends, ] where the kernel's does"


def _mask_limit(value: object) -> bool:
    """[row, oracle limit, apparent limit or null], each limit in [0, max_model_len]."""
    return (type(value) is list and len(value) == 3 and type(value[0]) is int and 0 <= value[0] <= MAX_ROWS
            and type(value[1]) is int and 0 <= value[1] <= MAX_MODEL_LEN
            and (value[2] is None or (type(value[2]) is int and 0 <= value[2] <= MAX_MODEL_LEN)))


def _overlap(value: object) -> bool:
    """A mean of per-row ratios in [0, 1]: its float sum may round a hair past 1; NaN for none compared."""
    if value == "nan" or (type(value) is float and math.isnan(value)):
        return True
    return type(value) in (int, float) and -1e-9 <= value <= 1 + 1e-9


MaskLimits = TupleOf(Rule(_mask_limit, "[row, oracle limit, apparent limit or null]", tuple).type(tuple), MASK_LIMITS,
                     f"a list of at most {MASK_LIMITS} [row, oracle limit, apparent limit or null]")
Overlap = Rule(_overlap, "a number in [0, 1], or 'nan'", float).type(float, AS_JSON_FLOAT)


@dataclasses.dataclass(frozen=True)
class Mismatch(Record):
    """The first disagreeing position of a row, with both values (None stands for -inf/NaN text)."""

    row: RowIndex
    position: Int(0, MAX_MODEL_LEN)
    expected: JsonFloat
    got: JsonFloat
    kind: Member(Verdict)


@dataclasses.dataclass(frozen=True)
class Comparison(Record):
    """Everything the report says about one backend on one case."""

    rows: Int(0, MAX_ROWS)
    mask_rows: Rows  # rows with a wrong -inf pattern: the headline
    nan_rows: Rows
    unwritten_rows: Rows
    value_rows: Rows
    positions_differing: Count
    max_abs_err: NonNegative
    max_rel_err: NonNegative  # error over the row's largest |expected| in the window
    # Mean over the rows whose window is longer than `topk` of their top-k overlap, tie-aware; None (n/a)
    # when no row's is: a top-k that keeps every position of a window picks it whatever the values.
    topk_overlap: Overlap | None
    first_mismatch: Mismatch | None
    verdict: Member(Verdict)
    # (row, the oracle's limit, the kernel's apparent limit) of the first MASK_LIMITS wrong-mask rows. The
    # apparent limit is how many leading positions are not -inf (nor poison): the window the kernel
    # behaved as if it had; None when its visible positions are no prefix (-inf between values).
    # Under tail-unspecified only the oracle's window is read: the first -inf in it.
    # Reports written before failures explained themselves have none of these.
    mask_limits: MaskLimits = ()
    explanation: Explanation | None = None  # the pattern the wrong windows follow (difftest.engine.explain)
    mask_strip: Text() | None = None  # the first wrong-mask row around its boundaries (STRIP_LEGEND)
    topk: Int(1, MAX_MODEL_LEN) = DEFAULT_TOPK  # the k of topk_overlap: the contract's (Contract.topk)

    def checked(self) -> None:
        """Every listed row is one of the comparison's."""
        for name in ("mask_rows", "nan_rows", "unwritten_rows", "value_rows"):
            rows = getattr(self, name)
            if rows and max(rows) >= self.rows:
                index = next(i for i, row in enumerate(rows) if row >= self.rows)
                raise SpecError(f"{name}[{index}]", rows[index], f"a row index in [0, rows = {self.rows})")


def compare(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor, contract: Contract,
            bound: torch.Tensor | None = None, next_n: int | None = None) -> Comparison:
    """Compare logits [rows, max_model_len]; row_lens (rows,) are the true causal limits.

    Inside a row's window every value must be finite and within max(rtol * row scale, bound);
    past it, -inf is required under TAIL_NEG_INF and anything goes under TAIL_UNSPECIFIED.
    `bound` (rows,) is the oracle's float32 rounding bound per row (fp32_error_bound). It is never
    widened for a narrower accumulator: a worst-case bound at FP8-MMA precision (~14 bits) is about
    as large as the logits themselves at H 64, D 128, and it once passed a row scored with another
    request's q (docs/findings/deepgemm-zero-length-request.md). Such a backend declares a wider rtol.

    `next_n` (rows per request) lets the wrong windows be explained request by request
    (difftest.engine.explain, which also reads the contract's tiles); without it only the relations that
    need no requests are tried. The top-k overlap is taken at the contract's top-k (Contract.topk).
    """
    rows, width = expected.shape
    if tuple(got.shape) != (rows, width):
        raise ValueError(f"backend returned logits of shape {tuple(got.shape)}, expected {(rows, width)}")
    # Rows a few at a time: the float64 copies and masks of a whole 2^31-element output would not fit.
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    parts = [_compare_rows(expected[first:first + step], got[first:first + step], row_lens[first:first + step],
                           contract, None if bound is None else bound[first:first + step], first)
             for first in range(0, rows, step)]
    explained = functools.partial(explain, next_n=next_n, row_lens=row_lens, width=width,
                                  tail_checked=contract.mask == MaskConvention.TAIL_NEG_INF, tiles=contract.tiles)
    return _combined(parts, rows, explained, contract.topk)


def compare_spans(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor, contract: Contract,
                  bound: torch.Tensor | None, spans: list[tuple[int, int]]) -> list[Comparison | None]:
    """The comparison of each span (first row, rows) of a batch's logits (difftest.engine.batch), in one pass
    over all rows. A span without a wrong position gets what compare() gives it alone (the positions
    past a span's own max_model_len are outside every window of it, so they add no error). A span with
    one gets its verdict, its wrong rows by kind, the count of wrong positions and its error maxima,
    but not the details that need its own slice (first_mismatch, mask_limits, mask_strip, explanation):
    enough to decide that it is tried again, whose result is the one reported (difftest.engine.runner); on a
    GPU comparing each failed member alone cost ~3 ms. One caveat: top-k picks among equal backend
    values may fall otherwise than alone (torch.topk over a batch's longer rows), which can move
    topk_overlap of a backend that is not exact; no verdict depends on it."""
    stats = [_row_stats(expected[first:first + step], got[first:first + step], row_lens[first:first + step],
                        contract, None if bound is None else bound[first:first + step])
             for first, step in _chunks(*expected.shape)]
    kinds, differing, abs_err, rel_err, active = (torch.cat([s[i] for s in stats], dim=-1) for i in range(5))
    fractions = torch.cat([s[5] for s in stats]).tolist()  # one per row longer than the top-k, in row order
    before = torch.cumsum(active, 0).tolist()  # such rows up to and including each row
    kinds, differing, abs_err, rel_err = kinds.tolist(), differing.tolist(), abs_err.tolist(), rel_err.tolist()
    row_wrong = [any(flags) for flags in zip(*kinds, strict=True)]
    out: list[Comparison] = []
    for first, rows in spans:
        lo, hi = (before[first - 1] if first else 0), (before[first + rows - 1] if rows else 0)
        # Correctly rounded, as compare() sums its own: the same float, whatever the order.
        overlap = (math.fsum(fractions[lo:hi]), hi - lo)
        if not any(row_wrong[first:first + rows]):  # most spans: no kind of wrong row to sort out
            out.append(_passed(rows, max(abs_err[first:first + rows], default=0.0),
                               max(rel_err[first:first + rows], default=0.0), overlap, contract.topk))
            continue
        bad_rows = {kind: [r for r in range(rows) if flags[first + r]]
                    for kind, flags in zip(_KINDS, kinds, strict=True)}
        part = _Part(bad_rows, sum(differing[first:first + rows]), max(abs_err[first:first + rows], default=0.0),
                     max(rel_err[first:first + rows], default=0.0), overlap, None, [], None)
        out.append(_combined([part], rows, functools.partial(explain, next_n=None, row_lens=row_lens), contract.topk))
    return out


def _passed(rows: int, max_abs_err: float, max_rel_err: float, overlap: tuple[float, int], k: int) -> Comparison:
    """What _combined makes of one slice of `rows` rows without a wrong position (compare_spans' many
    passing members: a batch's judging spent more on combining empty row lists than on comparing)."""
    return Comparison(rows=rows, mask_rows=[], nan_rows=[], unwritten_rows=[], value_rows=[], positions_differing=0,
                      max_abs_err=max_abs_err, max_rel_err=max_rel_err, topk_overlap=_mean(*overlap),
                      first_mismatch=None, verdict=Verdict.PASS, topk=k)


def _chunks(rows: int, width: int) -> list[tuple[int, int]]:
    """(first row, rows) of the slices compared at once: a few float64 copies of each stay small."""
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    return [(first, min(step, rows - first)) for first in range(0, rows, step)]


@dataclasses.dataclass(frozen=True)
class _Slice:
    """A slice of rows made ready to judge: both sides in float64 on the oracle's device, where each
    row's window is, which positions are poison, which are wrong and how (by failure kind), and the
    absolute error of every finite position inside a window."""

    expected: torch.Tensor
    got: torch.Tensor
    inside: torch.Tensor
    poison: torch.Tensor
    kinds: dict[Verdict, torch.Tensor]
    errors: torch.Tensor

    @classmethod
    def of(cls, expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor, contract: Contract,
           bound: torch.Tensor | None) -> _Slice:
        poison = is_poison(got).to(expected.device)
        got = got.to(expected.device, torch.float64)
        expected = expected.to(torch.float64)
        width = expected.shape[1]
        inside = torch.arange(width, device=expected.device)[None, :] < row_lens.to(expected.device)[:, None]
        kinds = _position_kinds(expected, got, inside, poison, contract, bound)
        errors = torch.where(inside & torch.isfinite(got), (got - expected).abs(), 0.0).nan_to_num(0.0)
        return cls(expected, got, inside, poison, kinds, errors)


def _row_stats(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor, contract: Contract,
               bound: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Per row of a slice: whether it has a wrong position of each kind (len(_KINDS), rows), its wrong
    positions, the largest absolute and relative error, whether its window is longer than the contract's
    top-k; and the top-k overlap of each such row."""
    s = _Slice.of(expected, got, row_lens, contract, bound)
    fractions, active = _topk_fractions(expected, got, row_lens, contract.topk)  # ranked in their own types
    relative = s.errors / _row_scale(s.expected, s.inside)[:, None]
    wrong = torch.stack([s.kinds[kind] for kind in _KINDS])
    return (wrong.any(dim=2), wrong.any(dim=0).sum(dim=1), s.errors.amax(dim=1), relative.amax(dim=1), active,
            fractions)


@dataclasses.dataclass(frozen=True)
class _Part:
    """The comparison of a slice of rows, row numbers already those of the whole output."""

    bad_rows: dict[Verdict, list[int]]
    positions_differing: int
    max_abs_err: float
    max_rel_err: float
    overlap: tuple[float, int]  # (sum of per-row top-k overlaps, rows whose window is longer than k)
    first_mismatch: Mismatch | None
    mask_limits: list[MaskLimit]  # of at most MASK_LIMITS of its wrong-mask rows
    mask_strip: str | None  # of its first wrong-mask row


def _compare_rows(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor, contract: Contract,
                  bound: torch.Tensor | None, first: int) -> _Part:
    s = _Slice.of(expected, got, row_lens, contract, bound)
    overlap = _topk_hits(expected, got, row_lens, contract.topk)  # ranked in their own types
    expected, got, poison, kinds, errors = s.expected, s.got, s.poison, s.kinds, s.errors
    scale = _row_scale(expected, s.inside)
    any_bad = torch.stack(list(kinds.values())).any(dim=0)
    mismatch = _first_mismatch(expected, got, kinds)
    limits = _apparent_limits(got, poison, row_lens, _rows_with(kinds[Verdict.FAIL_MASK])[:MASK_LIMITS],
                              contract.mask == MaskConvention.TAIL_NEG_INF)
    strip = _strip(got, poison, kinds[Verdict.FAIL_MASK], limits[0], first) if limits else None
    return _Part(bad_rows={kind: [first + r for r in _rows_with(mask)] for kind, mask in kinds.items()},
                 positions_differing=int(any_bad.sum()), max_abs_err=float(errors.max()) if errors.numel() else 0.0,
                 max_rel_err=float((errors / scale[:, None]).max()) if errors.numel() else 0.0,
                 overlap=overlap,
                 first_mismatch=dataclasses.replace(mismatch, row=mismatch.row + first) if mismatch else None,
                 mask_limits=[(row + first, oracle, apparent) for row, oracle, apparent in limits], mask_strip=strip)


def _combined(parts: list[_Part], rows: int, explained: Callable[..., Explanation | None], k: int) -> Comparison:
    bad_rows = {kind: [r for part in parts for r in part.bad_rows[kind]] for kind in _KINDS}
    hits, counted = sum(p.overlap[0] for p in parts), sum(p.overlap[1] for p in parts)
    limits = tuple(limit for part in parts for limit in part.mask_limits)[:MASK_LIMITS]
    return Comparison(
        rows=rows, mask_rows=bad_rows[Verdict.FAIL_MASK], nan_rows=bad_rows[Verdict.FAIL_NAN],
        unwritten_rows=bad_rows[Verdict.FAIL_UNWRITTEN], value_rows=bad_rows[Verdict.FAIL_VALUE],
        positions_differing=sum(p.positions_differing for p in parts),
        max_abs_err=max((p.max_abs_err for p in parts), default=0.0),
        max_rel_err=max((p.max_rel_err for p in parts), default=0.0),
        topk_overlap=_mean(hits, counted), topk=k,
        first_mismatch=next((p.first_mismatch for p in parts if p.first_mismatch), None),
        verdict=worst([k for k, rows_ in bad_rows.items() if rows_]),
        mask_limits=limits, explanation=explained(limits, wrong_rows=bad_rows[Verdict.FAIL_MASK],
                                                   value_rows=bad_rows[Verdict.FAIL_VALUE]),
        mask_strip=next((p.mask_strip for p in parts if p.mask_strip), None))


def _position_kinds(expected: torch.Tensor, got: torch.Tensor, inside: torch.Tensor, poison: torch.Tensor,
                    contract: Contract, bound: torch.Tensor | None) -> dict[Verdict, torch.Tensor]:
    """Boolean [rows, width] masks of each kind of wrong position; a position counts once, worst kind."""
    checked = inside | (contract.mask == MaskConvention.TAIL_NEG_INF)
    unwritten = poison & checked
    nan = torch.isnan(got) & inside & ~unwritten
    neg_inf_inside = inside & torch.isneginf(got)
    not_inf_outside = ~inside & ~torch.isneginf(got) & (contract.mask == MaskConvention.TAIL_NEG_INF) & ~unwritten
    mask = neg_inf_inside | not_inf_outside
    tol = tolerance(expected, inside, contract.rtol, bound)
    # +inf (an overflow) inside the window is a value error too, not a value that escapes every check.
    value = inside & ~torch.isnan(got) & ~torch.isneginf(got) & ((got - expected).abs() > tol[:, None])
    return {Verdict.FAIL_UNWRITTEN: unwritten, Verdict.FAIL_NAN: nan, Verdict.FAIL_MASK: mask & ~nan,
            Verdict.FAIL_VALUE: value}


def tolerance(expected: torch.Tensor, inside: torch.Tensor, rtol: float,
              bound: torch.Tensor | None) -> torch.Tensor:
    """(rows,) allowed |got - expected| of each row: `rtol` (a contract's) times the row's largest |expected|
    in its window, or the oracle's fp32 bound, whichever is larger."""
    tol = rtol * _row_scale(expected, inside)
    return tol if bound is None else torch.maximum(tol, bound.to(tol))


def _row_scale(expected: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """(rows,) largest |expected| inside each window; 1 where the window is empty or all zero."""
    mags = torch.where(inside, expected.abs(), 0.0).nan_to_num(0.0).amax(dim=1)
    return torch.where(mags > 0, mags, torch.ones_like(mags))


def _rows_with(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask.any(dim=1)).flatten().tolist()


def _apparent_limits(got: torch.Tensor, poison: torch.Tensor, row_lens: torch.Tensor, rows: list[int],
                     tail_checked: bool) -> list[MaskLimit]:
    """(row, oracle limit, apparent limit) of `rows` of this slice, all rows at once (see Comparison)."""
    if not rows:
        return []
    picked = torch.tensor(rows, device=got.device)
    lens = row_lens.to(got.device)[picked]
    positions = torch.arange(got.shape[1], device=got.device)[None, :]
    visible = ~torch.isneginf(got[picked]) & ~poison[picked]
    if not tail_checked:  # past the oracle's window anything goes: only the window tells
        visible |= positions >= lens[:, None]
    hidden = ~visible
    # argmax of a 0/1 row is its first 1; a row with nothing hidden is visible to its end.
    ends = torch.where(hidden.any(dim=1), hidden.to(torch.uint8).argmax(dim=1), got.shape[1])
    after = visible & (positions > ends[:, None])
    if not tail_checked:
        after &= positions < lens[:, None]
    prefix = ~after.any(dim=1)
    return [(row, oracle, end if whole else None)
            for row, oracle, end, whole in zip(rows, lens.tolist(), ends.tolist(), prefix.tolist(), strict=True)]


def _strip(got: torch.Tensor, poison: torch.Tensor, wrong: torch.Tensor, limit: MaskLimit, first: int) -> str:
    """'row 5 (oracle limit 13, kernel 12), p 1-25: ...vvvvvvvvvvv]-|----------...': the row around
    the oracle's limit and the kernel's (its first wrong position when its window has holes)."""
    row, oracle, apparent = limit
    width = got.shape[1]
    focus = apparent if apparent is not None else int(torch.nonzero(wrong[row])[0])
    spans = _merged([(max(0, f - STRIP_SPAN), min(width, f + STRIP_SPAN)) for f in sorted({oracle, focus})])
    values = got[row]
    pieces = [_strip_text(values[lo:hi], poison[row, lo:hi], lo, oracle, apparent) for lo, hi in spans]
    text = ("..." if spans[0][0] > 0 else "") + "...".join(pieces) + ("..." if spans[-1][1] < width else "")
    where = ", ".join(f"{lo}-{hi - 1}" for lo, hi in spans)
    kernel = "not a prefix" if apparent is None else str(apparent)
    return f"row {row + first} (oracle limit {oracle}, kernel {kernel}), p {where}: {text}"


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _strip_text(values: torch.Tensor, poison: torch.Tensor, start: int, oracle: int, apparent: int | None) -> str:
    """One character per position, '|' before the oracle's limit and ']' before the kernel's."""
    chars = []
    for offset, (value, poisoned) in enumerate(zip(values.tolist(), poison.tolist(), strict=True)):
        chars.append(_marks(start + offset, oracle, apparent) + _symbol(value, poisoned))
    end = start + len(chars)
    return "".join(chars) + _marks(end, oracle, apparent)


def _marks(position: int, oracle: int, apparent: int | None) -> str:
    return ("]" if position == apparent else "") + ("|" if position == oracle else "")


def _symbol(value: float, poisoned: bool) -> str:
    if poisoned:
        return "?"
    if math.isnan(value):
        return "N"
    if math.isinf(value):
        return "-" if value < 0 else "+"
    return "v"


def _first_mismatch(expected: torch.Tensor, got: torch.Tensor,
                    kinds: dict[Verdict, torch.Tensor]) -> Mismatch | None:
    """The lowest (row, position) that is wrong in any way, with the kind that position shows."""
    for row, position in _first_positions(torch.stack(list(kinds.values())).any(dim=0)):
        kind = worst([k for k, m in kinds.items() if m[row, position]])
        return Mismatch(row, position, float(expected[row, position]), float(got[row, position]), kind)
    return None


def _first_positions(bad: torch.Tensor) -> list[tuple[int, int]]:
    found = torch.nonzero(bad)
    return [tuple(found[0].tolist())] if len(found) else []  # type: ignore[list-item]


def topk_overlap(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor,
                 k: int = DEFAULT_TOPK) -> float | None:
    """Mean over the rows whose window is longer than k of |top-k(got) among the true top-k| / k; None
    (not applicable) when no row's window is: a top-k that keeps a whole window keeps it whatever
    the values, so an overlap there would read 1.0 for any backend that leaves the mask right.

    Ties are honoured: a pick counts as a hit when its expected value is at least the k-th largest
    expected value of the row, so integer-valued cases with many equal logits score 1.0 when the
    backend is exact. NaN and -inf in `got` rank last.
    """
    hits, counted = _topk_hits(expected, got, row_lens, k)
    return _mean(hits, counted)


def _mean(hits: float, counted: int) -> float | None:
    return hits / counted if counted else None


def _topk_hits(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor, k: int) -> tuple[float, int]:
    """(sum over the rows whose window is longer than k of their top-k overlap, the number of such rows)."""
    fractions, ranked = _topk_fractions(expected, got, row_lens, k)
    # fsum: correctly rounded, so a member's sum in a batch (compare_spans) is the same float as alone.
    return (math.fsum(fractions.tolist()), int(ranked.sum())) if fractions.numel() else (0.0, 0)


def _topk_fractions(expected: torch.Tensor, got: torch.Tensor, row_lens: torch.Tensor,
                    k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the top-k overlap of each row whose window is longer than k, in row order; which rows those are).

    Ranked in each side's own float type (float32 -> float64 keeps every value and its order, so the
    ranking is the same, at half the memory traffic), with torch.topk unsorted. The k-th largest
    expected value is the smallest (not NaN) of the top k: NaN ranks above everything, as torch.topk
    does, so a row with k NaN in its window has no hit."""
    device = expected.device
    lens = row_lens.to(device)
    ranked = lens > k
    if not bool(ranked.any()):  # every window is its own top k (always at CPU scale): nothing to rank
        return torch.zeros(0, dtype=torch.float64, device=device), ranked
    exp, out, lens = _rankable(expected)[ranked], _rankable(got.to(device))[ranked], lens[ranked]
    inside = torch.arange(exp.shape[1], device=device)[None, :] < lens[:, None]
    ranked_exp = torch.where(inside, exp, -math.inf)
    ranked_got = torch.where(inside & ~torch.isnan(out), out, -math.inf)
    top = ranked_exp.topk(k, dim=1, sorted=False).values
    kth = torch.where(torch.isnan(top), math.inf, top).amin(dim=1)
    picked = ranked_got.topk(k, dim=1, sorted=False).indices
    # A pick the backend scored -inf or NaN is no hit, whichever -inf tie torch.topk happened to take.
    hits = ((ranked_exp.gather(1, picked) >= kth[:, None]) & (ranked_got.gather(1, picked) > -math.inf)).sum(dim=1)
    hits = torch.where((inside & torch.isnan(exp)).sum(dim=1) >= k, 0, hits)  # the k-th largest is NaN
    return hits.double() / k, ranked


def _rankable(values: torch.Tensor) -> torch.Tensor:
    """`values` as a float type whose order is theirs: their own when floating, else float64."""
    return values if values.is_floating_point() else values.double()
