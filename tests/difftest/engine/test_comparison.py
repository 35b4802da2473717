"""compare(): planted faults in a copy of the oracle's logits, each reported as its kind, row and position."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from difftest.core.contract import DEFAULT_TOPK, Contract
from difftest.core.errors import SpecError
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.poison import is_poison, poisoned
from difftest.core.verdict import Verdict
from difftest.engine.comparison import Mismatch, compare, compare_spans, topk_overlap
from difftest.generators import build_case
from difftest.oracles.paged_mqa_logits import reference
from tests.support import TINY

STRICT = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF, rtol=1e-3)
LOOSE_TAIL = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_UNSPECIFIED, rtol=1e-3)
# Lengths 0, 1 and short rows, a full-length one, a boundary one: next_n 2, max_model_len 20.
SPEC = TINY.replace(name="compare", next_n=2, lengths=(0, 1, 9, 20, 13))


@pytest.fixture(scope="module")
def oracle():
    case = build_case(SPEC, 7)
    return reference(case), case.row_lens().reshape(-1)


def _row_with_window(lens: torch.Tensor, at_least: int = 3, below_max: bool = False) -> int:
    for row, length in enumerate(lens.tolist()):
        if length >= at_least and (not below_max or length < SPEC.max_model_len):
            return row
    raise AssertionError(f"no row with length >= {at_least} in {lens.tolist()}")


def test_exact_copy_passes(oracle):
    expected, lens = oracle
    result = compare(expected, expected.clone(), lens, STRICT)
    assert result.verdict == Verdict.PASS, f"{result=}"
    assert result.mask_rows == result.nan_rows == result.unwritten_rows == result.value_rows == []
    assert (result.positions_differing, result.max_abs_err, result.max_rel_err) == (0, 0.0, 0.0), f"{result=}"
    assert result.first_mismatch is None and result.rows == 10, f"{result=}"
    assert result.topk_overlap is None and result.topk == DEFAULT_TOPK, "every window is shorter than the top-k"


def test_float32_copy_passes(oracle):
    expected, lens = oracle
    result = compare(expected, expected.float(), lens, STRICT)
    assert result.verdict == Verdict.PASS and 0 < result.max_rel_err < 1e-6, f"{result=}"


def test_wrong_neg_inf_inside_window(oracle):
    expected, lens = oracle
    row = _row_with_window(lens)
    pos = int(lens[row]) - 2
    got = expected.clone()
    got[row, pos] = -math.inf
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == Verdict.FAIL_MASK, f"{result.verdict=}"
    assert result.mask_rows == [row], f"{result.mask_rows=}, {row=}"
    assert result.nan_rows == result.value_rows == result.unwritten_rows == [], f"{result=}"
    assert result.positions_differing == 1, f"{result.positions_differing=}"
    want = Mismatch(row, pos, float(expected[row, pos]), -math.inf, Verdict.FAIL_MASK)
    assert result.first_mismatch == want, f"{result.first_mismatch=} {want=}"


def test_window_cut_short_by_one_is_a_mask_failure(oracle):
    """An off-by-one at the window end: the last visible key masked."""
    expected, lens = oracle
    got = expected.clone()
    for row, length in enumerate(lens.tolist()):
        if length:
            got[row, length - 1] = -math.inf
    result = compare(expected, got, lens, STRICT)
    windowed = [r for r, n in enumerate(lens.tolist()) if n]
    assert result.verdict == Verdict.FAIL_MASK and result.mask_rows == windowed, f"{result.mask_rows=} {windowed=}"


def test_finite_value_in_tail_depends_on_mask_convention(oracle):
    expected, lens = oracle
    row = _row_with_window(lens, below_max=True)
    pos = int(lens[row])  # first position past the window
    got = expected.clone()
    got[row, pos] = 1.5
    strict = compare(expected, got, lens, STRICT)
    assert strict.verdict == Verdict.FAIL_MASK and strict.mask_rows == [row], f"{strict=}"
    assert strict.first_mismatch == Mismatch(row, pos, -math.inf, 1.5, Verdict.FAIL_MASK), f"{strict.first_mismatch=}"
    loose = compare(expected, got, lens, LOOSE_TAIL)
    assert loose.verdict == Verdict.PASS and loose.mask_rows == [], f"{loose=}"


def test_garbage_in_every_tail_passes_only_when_unspecified(oracle):
    expected, lens = oracle
    outside = torch.arange(expected.shape[1])[None, :] >= lens[:, None]
    got = torch.where(outside, torch.full_like(expected, 1e36), expected)
    got[outside & (torch.arange(expected.shape[1])[None, :] % 2 == 0)] = math.nan
    assert compare(expected, got, lens, LOOSE_TAIL).verdict == Verdict.PASS
    strict = compare(expected, got, lens, STRICT)
    short_rows = [r for r, n in enumerate(lens.tolist()) if n < expected.shape[1]]
    assert strict.verdict == Verdict.FAIL_MASK and strict.mask_rows == short_rows, f"{strict.mask_rows=} {short_rows=}"
    assert strict.nan_rows == [], "NaN past the window is a mask fault, not a NaN inside the window"


def test_nan_inside_window(oracle):
    expected, lens = oracle
    row = _row_with_window(lens)
    got = expected.clone()
    got[row, 1] = math.nan
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == Verdict.FAIL_NAN and result.nan_rows == [row], f"{result=}"
    assert result.mask_rows == [], f"a NaN is not also a mask fault: {result.mask_rows=}"
    assert result.first_mismatch.kind == Verdict.FAIL_NAN and result.first_mismatch.position == 1


def test_unwritten_row_in_poisoned_buffer(oracle):
    expected, lens = oracle
    row = _row_with_window(lens)
    out = poisoned(tuple(expected.shape), torch.float32, "cpu")
    assert is_poison(out).all(), "poisoned() must fill every position"
    for r in range(expected.shape[0]):
        if r != row:
            out[r] = expected[r].float()
    assert not is_poison(out).any(dim=1)[[r for r in range(expected.shape[0]) if r != row]].any()
    result = compare(expected, out, lens, STRICT)
    assert result.verdict == Verdict.FAIL_UNWRITTEN, f"{result.verdict=}"
    assert result.unwritten_rows == [row] and result.nan_rows == [] and result.mask_rows == [], f"{result=}"
    assert result.first_mismatch.kind == Verdict.FAIL_UNWRITTEN and result.first_mismatch.row == row


def test_computed_nan_is_not_poison(oracle):
    expected, lens = oracle
    row = _row_with_window(lens)
    got = expected.float()
    got[row, 0] = float("nan")  # 0x7FC00000: what arithmetic makes
    assert not is_poison(got).any(), "a computed NaN must not look like the sentinel"
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == Verdict.FAIL_NAN and result.unwritten_rows == [], f"{result=}"


def test_unwritten_tail_under_unspecified_is_fine(oracle):
    """Under TAIL_UNSPECIFIED only the windows must be written."""
    expected, lens = oracle
    out = poisoned(tuple(expected.shape), torch.float32, "cpu")
    inside = torch.arange(expected.shape[1])[None, :] < lens[:, None]
    out[inside] = expected[inside].float()
    assert compare(expected, out, lens, LOOSE_TAIL).verdict == Verdict.PASS
    strict = compare(expected, out, lens, STRICT)
    assert strict.verdict == Verdict.FAIL_UNWRITTEN, f"{strict.verdict=}"


@pytest.mark.parametrize("factor, verdict", [(2.0, Verdict.FAIL_VALUE), (0.5, Verdict.PASS)])
def test_value_error_against_rtol(oracle, factor, verdict):
    expected, lens = oracle
    row = _row_with_window(lens)
    window = expected[row, : int(lens[row])]
    scale = float(window.abs().max())
    pos = int(window.abs().argmin())  # the smallest value: the error is relative to the row, not the element
    got = expected.clone()
    got[row, pos] += factor * STRICT.rtol * scale
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == verdict, f"{factor=}: {result.verdict=} {result.max_rel_err=}"
    assert result.max_rel_err == pytest.approx(factor * STRICT.rtol, rel=1e-6), f"{result.max_rel_err=}"
    if verdict == Verdict.FAIL_VALUE:
        assert result.value_rows == [row] and result.mask_rows == [], f"{result=}"
        assert (result.first_mismatch.row, result.first_mismatch.position) == (row, pos), f"{result.first_mismatch=}"


def test_pos_inf_inside_window_is_a_value_error(oracle):
    """An overflow to +inf is not finite, not NaN, not -inf: it must still fail."""
    expected, lens = oracle
    row = _row_with_window(lens)
    got = expected.float()
    got[row, 0] = math.inf
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == Verdict.FAIL_VALUE and result.value_rows == [row], f"{result=}"
    assert result.first_mismatch == Mismatch(row, 0, float(expected[row, 0]), math.inf, Verdict.FAIL_VALUE)


def test_bound_widens_the_tolerance_per_row(oracle):
    expected, lens = oracle
    row = _row_with_window(lens)
    scale = float(expected[row, : int(lens[row])].abs().max())
    got = expected.clone()
    got[row, 0] += 2 * STRICT.rtol * scale
    bound = torch.zeros(expected.shape[0])
    assert compare(expected, got, lens, STRICT, bound).verdict == Verdict.FAIL_VALUE
    bound[row] = 3 * STRICT.rtol * scale
    assert compare(expected, got, lens, STRICT, bound).verdict == Verdict.PASS


def test_shape_mismatch_raises(oracle):
    expected, lens = oracle
    with pytest.raises(ValueError, match=r"shape \(10, 19\)"):
        compare(expected, expected[:, :-1], lens, STRICT)


def test_several_faults_take_the_worst_verdict_and_list_every_row(oracle):
    expected, lens = oracle
    windowed = [r for r, n in enumerate(lens.tolist()) if n >= 2]
    mask_row, value_row, nan_row = windowed[:3]
    got = expected.clone()
    got[mask_row, 0] = -math.inf
    scale = float(expected[value_row, : int(lens[value_row])].abs().max())
    got[value_row, 1] += 10 * STRICT.rtol * scale
    assert compare(expected, got, lens, STRICT).verdict == Verdict.FAIL_MASK
    got[nan_row, 0] = math.nan
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == Verdict.FAIL_NAN, f"{result.verdict=}"
    assert (result.mask_rows, result.value_rows, result.nan_rows) == ([mask_row], [value_row], [nan_row]), f"{result=}"
    assert result.first_mismatch.row == min(mask_row, value_row, nan_row), f"{result.first_mismatch=}"


# --------------------------------------------------------------------------- top-k overlap

def _ramp(length: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    expected = torch.full((1, width), -math.inf, dtype=torch.float64)
    expected[0, :length] = torch.arange(length, dtype=torch.float64)
    return expected, torch.tensor([length])


def test_topk_exact_is_one():
    expected, lens = _ramp(DEFAULT_TOPK + 5, DEFAULT_TOPK + 9)
    assert topk_overlap(expected, expected.clone(), lens) == 1.0


def test_topk_of_a_permuted_long_row_is_predictable():
    length = DEFAULT_TOPK + 952
    expected, lens = _ramp(length, length + 8)
    got = expected.clone()
    got[0, :length] = expected[0, :length].flip(0)  # the ranking reversed
    # top-k of got: positions 0..2047; true top-k: positions 952..2999; both hold 2048 - 952.
    want = (DEFAULT_TOPK - (length - DEFAULT_TOPK)) / DEFAULT_TOPK
    assert topk_overlap(expected, got, lens) == pytest.approx(want), f"{want=}"
    result = compare(expected, got, lens, STRICT)
    assert result.topk_overlap == pytest.approx(want) and result.verdict == Verdict.FAIL_VALUE, f"{result.verdict=}"


def test_topk_of_windows_no_longer_than_k_is_not_applicable(oracle):
    """A top-k keeps a whole window of at most k positions whatever its values: no overlap to report (it read
    1.000 for values 173 % off). A -inf the top-k would see is the mask's count, not the overlap's."""
    expected, lens = _ramp(12, 20)
    got = expected.clone()
    got[0, :12] = expected[0, :12].flip(0) * 2.73
    assert topk_overlap(expected, got, lens) is None and topk_overlap(expected, got, lens, k=12) is None
    result = compare(expected, got, lens, STRICT)
    assert result.verdict == Verdict.FAIL_VALUE and result.topk_overlap is None, f"{result=}"
    assert topk_overlap(expected, got, lens, k=11) == pytest.approx(10 / 11), "one longer than k: ranked"
    expected, lens = oracle
    assert topk_overlap(expected, expected.clone(), lens) is None


def test_the_top_k_is_the_contracts():
    expected, lens = _ramp(40, 48)
    got = expected.clone()
    got[0, :40] = expected[0, :40].flip(0)  # the ranking reversed: the top 8 are the bottom 8
    narrow = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF, rtol=1e9, topk=8)
    result = compare(expected, got, lens, narrow)
    assert (result.verdict, result.topk, result.topk_overlap) == (Verdict.PASS, 8, 0.0), f"{result=}"
    assert compare(expected, got, lens, dataclasses.replace(narrow, topk=40)).topk_overlap is None
    with pytest.raises(SpecError, match=r"topk=0: expected an integer >= 1"):
        dataclasses.replace(narrow, topk=0)


def test_topk_ties_count_as_hits():
    """Integer-valued logits with many ties: a backend within tolerance that orders ties differently scores 1."""
    length = DEFAULT_TOPK + 500
    expected = torch.full((1, length + 4), -math.inf, dtype=torch.float64)
    expected[0, :length] = (torch.arange(length) % 3).double()  # 0, 1, 2 repeated: the k-th value is tied
    gen = torch.Generator().manual_seed(0)
    got = expected.clone()
    got[0, :length] += 1e-9 * torch.rand(length, generator=gen, dtype=torch.float64)
    lens = torch.tensor([length])
    naive = set(expected[0].topk(DEFAULT_TOPK).indices.tolist()) & set(got[0].topk(DEFAULT_TOPK).indices.tolist())
    assert len(naive) < DEFAULT_TOPK, "the ties must make index sets differ, or this test proves nothing"
    assert topk_overlap(expected, got, lens) == 1.0
    assert compare(expected, got, lens, STRICT).verdict == Verdict.PASS


def test_topk_ignores_rows_without_a_window_longer_than_k():
    expected = torch.full((3, 8), -math.inf, dtype=torch.float64)
    expected[1, :4] = torch.tensor([3.0, 1.0, 2.0, 0.0])
    lens = torch.tensor([0, 4, 0])
    got = expected.clone()
    got[1, 0] = -math.inf
    assert topk_overlap(expected, got, lens, k=2) == 0.5
    assert topk_overlap(expected[[0, 2]], expected[[0, 2]].clone(), lens[[0, 2]], k=2) is None


def test_topk_mean_over_rows():
    expected = torch.tensor([[2.0, 1.0, 0.0, -math.inf], [5.0, 4.0, 3.0, 2.0]], dtype=torch.float64)
    got = expected.clone()
    got[0, 0] = -math.inf  # row 0's top 2 lose position 0 to position 2: 1 of 2
    assert topk_overlap(expected, got, torch.tensor([3, 4]), k=2) == pytest.approx((1 / 2 + 1) / 2)


def test_the_fp32_bound_counts_but_is_never_widened():
    """A one-position row whose logit is a cancellation: its fp32 bound (from the sum of |terms|) is
    small, but 2^10 times it (a worst case at FP8-MMA precision) would exceed the logit itself and
    pass a row scored with another request's q, as DeepGEMM's zero-length bug does at H 64, D 128."""
    expected = torch.tensor([[-6.0, -math.inf]], dtype=torch.float64)
    lens, bound = torch.tensor([1]), torch.tensor([3.2e-3])  # x 2^10 = 3.3: half the logit
    contract = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF, rtol=1e-6)
    for error, verdict in ((2e-3, Verdict.PASS), (4e-3, Verdict.FAIL_VALUE), (3.0, Verdict.FAIL_VALUE)):
        got = expected.clone()
        got[0, 0] += error
        assert compare(expected, got, lens, contract, bound).verdict == verdict, error
    assert compare(expected, expected + torch.tensor([[3.0, 0.0]]), lens,
                   Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF,
                            rtol=1e-2), bound).verdict == Verdict.FAIL_VALUE, "DeepGEMM's rtol still rejects it"


def test_comparing_a_few_rows_at_a_time_gives_the_whole_comparison(oracle, monkeypatch):
    expected, lens = oracle
    rows = [int(r) for r in torch.nonzero(lens >= 4).flatten()]
    got = expected.clone().float()
    got[rows[0], 0] = -math.inf  # a mask error
    got[rows[-1], 3] += 5.0  # a value error further down
    got[rows[1], 1] = 7.5e37  # another value error in between
    whole = compare(expected, got, lens, STRICT)
    monkeypatch.setattr("difftest.engine.comparison.CHUNK_ELEMENTS", expected.shape[1])  # one row per chunk
    assert compare(expected, got, lens, STRICT) == whole, f"{whole=}"
    assert whole.mask_rows == [rows[0]] and whole.value_rows == sorted({rows[1], rows[-1]}), f"{whole=}"


# --------------------------------------------------------------------------- spans of a batch

def test_a_spans_comparison_is_compares_alone_or_a_failing_one_keeps_its_rows_and_errors(oracle):
    """compare_spans over a batch's output: a clean span gets compare()'s comparison of its slice; a
    failing one its verdict, wrong rows by kind (span-relative), wrong positions and error maxima."""
    expected, lens = oracle
    got = expected.clone()
    windowed = [r for r, n in enumerate(lens.tolist()) if n >= 2]
    got[windowed[-1], 0] = -math.inf  # a wrong mask in the last span
    got[windowed[-2], 1] += 10 * STRICT.rtol * float(expected[windowed[-2]].nan_to_num(0, 0, 0).abs().max())
    got[windowed[0], 0] = math.nan  # a NaN in the first
    spans = [(0, 2), (2, 4), (6, 2), (8, 2)]
    clean = {first for first, rows in spans if not any(first <= r < first + rows for r in windowed[:1] + windowed[-2:])}
    assert clean == {0, 6}, "the fixture's windowed rows moved: pick other rows"
    for (first, rows), got_span in zip(spans, compare_spans(expected, got, lens, STRICT, None, spans), strict=True):
        alone = compare(expected[first:first + rows], got[first:first + rows], lens[first:first + rows], STRICT)
        if first in clean:
            assert got_span == alone
            continue
        carried = ("verdict", "rows", "mask_rows", "nan_rows", "unwritten_rows", "value_rows", "positions_differing",
                   "max_abs_err", "max_rel_err")
        assert {f: getattr(got_span, f) for f in carried} == {f: getattr(alone, f) for f in carried}
        assert alone.verdict.failed and got_span.first_mismatch is None


def _overlap_by_definition(expected: torch.Tensor, got: torch.Tensor, lens: torch.Tensor) -> float | None:
    """The docstring's definition, row by row in float64 Python, over the rows longer than k: the got's top k
    positions (NaN and -inf last) that are at or above the k-th largest expected value (NaN largest), over k."""
    fractions = []
    k = DEFAULT_TOPK
    for exp_row, got_row, length in zip(expected.double().tolist(), got.double().tolist(), lens.tolist(), strict=True):
        if length <= k:
            continue
        window = exp_row[:length]
        kth = sorted(window, key=lambda v: (1, 0.0) if math.isnan(v) else (0, v), reverse=True)[k - 1]  # NaN first
        scored = [(v, p) for p, v in enumerate(got_row[:length]) if not math.isnan(v) and v > -math.inf]
        picked = [p for _v, p in sorted(scored, reverse=True)[:k]]
        fractions.append(sum(window[p] >= kth for p in picked) / k)
    return sum(fractions) / len(fractions) if fractions else None


NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"
ON_GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)])


@pytest.mark.parametrize("device", ["cpu", ON_GPU])
@pytest.mark.parametrize("seed", range(6))
def test_topk_overlap_is_its_definition_for_short_and_long_windows_nan_and_neg_inf(seed, device):
    gen = torch.Generator().manual_seed(seed)
    rows, width = 5, DEFAULT_TOPK + 700
    lens = torch.randint(0, width + 1, (rows,), generator=gen)
    lens[0], lens[1] = width, 3  # one long window, one short one (not ranked), whatever the draw
    expected = torch.randn(rows, width, generator=gen)
    if seed % 2:
        expected = torch.randint(-4, 5, (rows, width), generator=gen).float()  # ties in expected
    got = expected + 1e-3 * torch.randn(rows, width, generator=gen)  # no ties in got
    got[torch.rand(rows, width, generator=gen) < 0.05] = -math.inf
    got[torch.rand(rows, width, generator=gen) < 0.02] = math.nan
    expected[torch.rand(rows, width, generator=gen) < (0.4 if seed == 5 else 0.01)] = math.nan
    expected = torch.where(torch.arange(width)[None, :] < lens[:, None], expected, -math.inf)
    want = _overlap_by_definition(expected, got, lens)
    expected, got, lens = expected.to(device), got.to(device), lens.to(device)
    assert topk_overlap(expected, got, lens) == pytest.approx(want, rel=1e-12)
    assert topk_overlap(expected.double(), got.double(), lens) == pytest.approx(want, rel=1e-12)
