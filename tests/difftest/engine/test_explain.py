"""Failures that explain themselves: each wrong-mask row's limits, the relation fitted across a case, the strip.

Property tests draw kernel limits that follow each relation exactly (from its formula, written out here
independently of the explainer) and check it is named with its parameters, and that one row off the
relation is never named as it. Synthetic logits give each relation through compare(); planted kernels
give it through the runner, the report and the CLI; the new fields survive a JSON round trip, and an
older report's explanation still reads.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from difftest.backends.user import FunctionBackend
from difftest.cli import main
from difftest.core.case import row_limits
from difftest.core.contract import Contract
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.poison import poisoned
from difftest.core.schema import to_jsonable
from difftest.core.verdict import Verdict
from difftest.engine import comparison
from difftest.engine.comparison import MASK_LIMITS, compare
from difftest.engine.config import RunConfig
from difftest.engine.explain import Explanation, Pattern, Relation, Rounding, explain
from difftest.engine.result import CaseResult
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.records.report import explanation_lines, render_failures
from tests import planted
from tests import planted_patterns as pp
from tests import user_backends as ub
from tests.support import TINY

STRICT = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF, rtol=1e-3)
LOOSE_TAIL = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_UNSPECIFIED, rtol=1e-3)
NEXT_N = 3
WIDTH = 32
SEQ_LENS = torch.tensor([5, 9, 14, 20, 31])  # distinct, so a shift by one request shows on every row


def _logits(limits: torch.Tensor, width: int = WIDTH) -> torch.Tensor:
    """Ones where p < the row's limit, -inf after: a row's values matter here only as not -inf."""
    inside = torch.arange(width)[None, :] < limits.reshape(-1)[:, None]
    return torch.where(inside, 1.0, float("-inf")).double()


def _oracle() -> torch.Tensor:
    return row_limits(SEQ_LENS, NEXT_N).reshape(-1)


def _layout() -> tuple[torch.Tensor, torch.Tensor]:
    """(L_b, j) per row."""
    return SEQ_LENS.repeat_interleave(NEXT_N), torch.arange(NEXT_N).repeat(len(SEQ_LENS))


def _compared(kernel_limits: torch.Tensor, contract: Contract = STRICT, next_n: int | None = NEXT_N):
    lens = _oracle()
    return compare(_logits(lens), _logits(kernel_limits.clamp(0, WIDTH)), lens, contract, next_n=next_n)


def _explained(kernel_limits: torch.Tensor, **kwargs) -> Explanation:
    result = _compared(kernel_limits, **kwargs)
    assert result.verdict == Verdict.FAIL_MASK and result.explanation is not None, f"{result=}"
    assert result.explanation.explained == len(result.mask_limits), f"{result.explanation=}"
    return result.explanation


def _pattern_of(kernel_limits: torch.Tensor, **kwargs) -> Pattern:
    return _explained(kernel_limits, **kwargs).pattern


def test_each_wrong_row_records_the_oracle_limit_and_the_kernels():
    lens = _oracle()
    result = _compared((lens - 1).clamp(min=0))
    assert result.mask_rows == [r for r in range(len(lens)) if lens[r] > 0]
    assert result.mask_limits == tuple((r, int(lens[r]), int(lens[r]) - 1) for r in result.mask_rows)


def test_the_mirrored_mtp_window_is_named():
    lengths, j = _layout()
    assert _pattern_of(lengths - j + 1) == Pattern.MTP_MIRRORED


def test_the_mirrored_window_without_its_phantom_is_named_only_where_a_declared_tile_divides_l():
    """AITER writes the phantom 0.0 at p = L only when a processed chunk holds it, i.e. when its tile does not
    divide L: row 0 stops at L there. Anywhere else a row 0 at L is not the mirrored form."""
    lengths = torch.tensor([8, 9, 16, 21]).repeat_interleave(NEXT_N)
    j = torch.arange(NEXT_N).repeat(4)
    oracle = row_limits(lengths[::NEXT_N], NEXT_N).reshape(-1)
    mirrored = (lengths - j + 1).clamp(max=WIDTH)
    phantomless = torch.where((j == 0) & (lengths % 8 == 0), lengths, mirrored)  # the tile of 8 divides 8 and 16
    limits = [(r, int(oracle[r]), int(phantomless[r])) for r in range(len(oracle)) if phantomless[r] != oracle[r]]
    assert explain(limits, NEXT_N, oracle, width=WIDTH, tiles=(8,)).relation == Relation(Pattern.MTP_MIRRORED)
    assert explain(limits, NEXT_N, oracle, width=WIDTH).pattern != Pattern.MTP_MIRRORED, "no tile declared"
    assert explain(limits, NEXT_N, oracle, width=WIDTH, tiles=(5,)).pattern != Pattern.MTP_MIRRORED


def test_the_mirrored_window_under_an_unchecked_tail_is_named_from_the_rows_it_shortens():
    lengths, j = _layout()
    result = _compared(lengths - j + 1, contract=LOOSE_TAIL)
    # Only row j = 2 loses keys (row 0 sees more, row 1 the same at next_n 3, where L - 1 + 1 = L - 3 + 1 + 1).
    assert result.mask_rows and all(row % NEXT_N == 2 for row in result.mask_rows), f"{result.mask_rows=}"
    assert result.explanation is not None and result.explanation.pattern == Pattern.MTP_MIRRORED
    assert result.explanation.draft_rows == (2,)


def test_the_sequence_length_for_every_row_is_named():
    lengths, _ = _layout()
    assert _pattern_of(lengths) == Pattern.PER_SEQUENCE_LENGTH


def test_reversed_draft_rows_are_named():
    """Row j behaves as row next_n - 1 - j: L - j. It was 'no known pattern fits'."""
    lengths, j = _layout()
    explanation = _explained(lengths - j)
    assert explanation.relation == Relation(Pattern.REVERSED_DRAFT_ROWS) and explanation.draft_rows == (0, 2)


def test_per_sequence_length_at_next_n_2_is_not_the_mirrored_window():
    """The issue's case: every row of a request sees L at next_n 2 (row 0 one long, L - j) was named 'MTP window
    mirrored: L - j + 1', its own example showing L - j. Mirrored needs L + 1 at row 0."""
    seq_lens = torch.tensor([5, 9, 14, 20])
    oracle = row_limits(seq_lens, 2).reshape(-1)
    kernel = seq_lens.repeat_interleave(2)
    limits = [(r, int(oracle[r]), int(kernel[r])) for r in range(len(oracle)) if kernel[r] != oracle[r]]
    explanation = explain(limits, 2, oracle, width=WIDTH)
    assert explanation.relation == Relation(Pattern.PER_SEQUENCE_LENGTH) and not explanation.alternatives
    assert explanation.draft_rows == (0,) and explanation.example.kernel == explanation.example.length


def test_rows_clamped_at_the_width_list_what_else_fits():
    """Every L = max_model_len at next_n 2: row 1's L + 1 shows as L and row 0's L is the whole row, so an
    uncleaned tail, one long, every row at L and the mirrored window give the same rows. The first is
    named, the others listed; below the width one long is the only one."""
    oracle = row_limits(torch.full((3,), WIDTH), 2).reshape(-1)
    limits = [(r, WIDTH - 1, WIDTH) for r in (0, 2, 4)]
    explanation = explain(limits, 2, oracle, width=WIDTH)
    assert explanation.relation == Relation(Pattern.TAIL_NOT_CLEANED)
    assert explanation.alternatives == (Relation(Pattern.CONSTANT_OFFSET, offset=1),
                                        Relation(Pattern.PER_SEQUENCE_LENGTH), Relation(Pattern.MTP_MIRRORED))
    assert explanation_lines(explanation)[-1] == ("also fits: constant offset +1; per-sequence length; "
                                                  "AITER's mirrored MTP window")
    oracle = row_limits(torch.tensor([WIDTH, 20]), 2).reshape(-1)
    explanation = explain([(0, WIDTH - 1, WIDTH), (2, 19, 20), (3, 20, 21)], 2, oracle, width=WIDTH)
    assert (explanation.relation, explanation.alternatives) == (Relation(Pattern.CONSTANT_OFFSET, offset=1), ())


@pytest.mark.parametrize("next_n", [3, 4])
def test_the_wrong_draft_rows_are_listed(next_n):
    seq_lens = torch.tensor([9, 14, 20, 27])
    oracle = row_limits(seq_lens, next_n).reshape(-1)
    j = torch.arange(next_n).repeat(len(seq_lens))
    kernel = torch.where(j == 1, oracle - 2, oracle)  # only draft row 1 is short: no relation fits
    limits = [(r, int(oracle[r]), int(kernel[r])) for r in range(len(oracle)) if kernel[r] != oracle[r]]
    explanation = explain(limits, next_n, oracle, width=WIDTH)
    assert explanation.relation == Relation(Pattern.CONSTANT_OFFSET, offset=-2) and explanation.selective
    assert explanation.draft_rows == (1,)
    right = ", ".join(str(k) for k in range(next_n) if k != 1)
    assert f"wrong draft rows: j = 1 of next_n {next_n} (j = {right} right)" in explanation_lines(explanation)


def test_a_constant_offset_is_named_with_its_offset():
    explanation = _explained(_oracle() - 1)
    assert explanation.relation == Relation(Pattern.CONSTANT_OFFSET, offset=-1) and not explanation.selective
    assert "constant offset -1: every row's window is the oracle's -1 (window one short)" in \
        explanation_lines(explanation)[0]
    assert _explained(_oracle() + 2).relation == Relation(Pattern.CONSTANT_OFFSET, offset=2)


@pytest.mark.parametrize("shift", [1, -1])
def test_rows_shifted_by_one_request_are_named(shift):
    table = _oracle().reshape(-1, NEXT_N)
    shifted = torch.roll(table, shifts=shift, dims=0).reshape(-1)  # request 0 (or the last) gets the far end's
    explanation = _explained(shifted)
    assert explanation.relation == Relation(Pattern.SHIFTED_REQUEST, shift=shift)
    assert f"b {'-' if shift == 1 else '+'} 1's limits" in explanation_lines(explanation)[0]
    assert explanation.example.request not in (0 if shift == 1 else len(SEQ_LENS) - 1,), "an example with a source"


def test_windows_rounded_to_a_declared_tile_are_named():
    lens = _oracle()
    for rounding, kernel in ((Rounding.DOWN, lens // 4 * 4), (Rounding.UP, (lens + 3) // 4 * 4)):
        limits = [(r, int(lens[r]), int(kernel[r])) for r in range(len(lens)) if kernel[r] != lens[r]]
        explanation = explain(limits, NEXT_N, lens, width=WIDTH, tiles=(4, 64))
        assert explanation.relation == Relation(Pattern.TILE_TRUNCATED, tile=4, rounding=rounding), explanation
        assert explain(limits, NEXT_N, lens, width=WIDTH).pattern != Pattern.TILE_TRUNCATED, "no tile declared"


def test_no_window_is_named():
    assert _pattern_of(torch.zeros_like(_oracle())) == Pattern.NO_WINDOW


def test_a_tail_not_cleaned_is_named():
    lens = _oracle()
    got = _logits(lens)
    got[:, :][torch.isneginf(got)] = 0.5  # every tail finite
    result = compare(_logits(lens), got, lens, STRICT, next_n=NEXT_N)
    assert result.explanation is not None and result.explanation.pattern == Pattern.TAIL_NOT_CLEANED


def test_limits_that_follow_no_pattern_are_unknown_and_say_how_they_differ():
    kernel = _oracle().clone()
    kernel[0] += 1
    kernel[4] -= 3
    explanation = _compared(kernel).explanation
    assert explanation is not None and explanation.pattern == Pattern.UNKNOWN
    assert explanation.differences == ((1, 1), (-3, 1)) and explanation.draft_rows == (0, 1)
    assert "no known pattern fits: kernel - oracle limit is +1 on 1, -3 on 1" in explanation_lines(explanation)[0]


def test_without_next_n_only_request_free_patterns_are_tried():
    lengths, j = _layout()
    assert _pattern_of(_oracle() - 1, next_n=None) == Pattern.CONSTANT_OFFSET
    result = _compared(lengths - j + 1, next_n=None)
    assert result.explanation is not None and result.explanation.pattern == Pattern.UNKNOWN
    assert result.explanation.draft_rows == () and result.explanation.example.request is None


def test_a_mask_with_holes_has_no_apparent_limit_and_the_strip_shows_it():
    lens = _oracle()
    got = _logits(lens)
    row = int(torch.nonzero(lens >= 10)[0])
    got[row, 4] = float("-inf")  # a hole inside the window: -inf between values
    result = compare(_logits(lens), got, lens, STRICT, next_n=NEXT_N)
    assert result.mask_limits == ((row, int(lens[row]), None),)
    assert result.mask_strip is not None and "kernel not a prefix" in result.mask_strip
    assert "vvvv-vvvvv" in result.mask_strip, result.mask_strip
    assert result.explanation.pattern == Pattern.UNKNOWN and result.explanation.holes == 1


def test_the_strip_marks_both_limits_around_the_boundary():
    lens = torch.tensor([20])
    got = _logits(torch.tensor([17]), width=40)
    result = compare(_logits(lens, width=40), got, lens, STRICT)
    assert result.mask_strip == ("row 0 (oracle limit 20, kernel 17), p 5-31: "
                                 "...vvvvvvvvvvvv]---|------------...")
    got = got.float()
    got[0, 30] = float("nan")
    got[0, 31] = poisoned((1,), torch.float32, "cpu")[0]
    result = compare(_logits(lens, width=40), got, lens, STRICT)
    # A NaN past the window is visible: the kernel's mask is no prefix; poison is no value.
    assert result.mask_strip == ("row 0 (oracle limit 20, kernel not a prefix), p 5-31: "
                                 "...vvvvvvvvvvvv---|----------N?...")


def test_the_record_is_capped_and_the_same_a_few_rows_at_a_time(monkeypatch):
    seq_lens = torch.arange(1, 301)
    lens = row_limits(seq_lens, 1).reshape(-1)
    expected = _logits(lens, width=304)
    got = _logits(lens - 1, width=304)
    whole = compare(expected, got, lens, STRICT, next_n=1)
    assert len(whole.mask_rows) == 300 and len(whole.mask_limits) == MASK_LIMITS
    monkeypatch.setattr(comparison, "CHUNK_ELEMENTS", 7 * 304)
    chunked = compare(expected, got, lens, STRICT, next_n=1)
    assert chunked == whole
    assert whole.explanation is not None and whole.explanation.relation == Relation(Pattern.CONSTANT_OFFSET, offset=-1)


def test_explain_without_wrong_rows_is_none():
    assert explain((), NEXT_N, _oracle()) is None


# --------------------------------------------------------------------------- properties: exact fits, near misses

def _rows(seq_lens: torch.Tensor, next_n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, j, L_b, oracle limit) per row."""
    b = torch.arange(len(seq_lens)).repeat_interleave(next_n)
    j = torch.arange(next_n).repeat(len(seq_lens))
    return b, j, seq_lens[b], row_limits(seq_lens, next_n).reshape(-1)


def _follows(relation: Relation, seq_lens: torch.Tensor, next_n: int, width: int,
             tiles: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the limit each row shows under `relation`, a second limit it may show, whether the relation says
    nothing about the row), from the formulas of docs/reference/masks.md."""
    b, j, length, oracle = _rows(seq_lens, next_n)
    free = torch.zeros_like(b, dtype=torch.bool)
    p = relation.pattern
    if p == Pattern.CONSTANT_OFFSET:
        shown, also = oracle + relation.offset, length - next_n + j + 1 + relation.offset
    elif p == Pattern.PER_SEQUENCE_LENGTH:
        shown = also = length
    elif p == Pattern.REVERSED_DRAFT_ROWS:
        shown = also = length - j
    elif p == Pattern.ROTATED_DRAFT_ROWS:
        shown = also = length - next_n + (j + relation.shift) % next_n + 1
    elif p == Pattern.MTP_MIRRORED:
        shown = length - j + 1
        whole = torch.tensor([any(int(n) % t == 0 for t in tiles) for n in length.tolist()], dtype=torch.bool)
        also = torch.where((j == 0) & whole, length, shown)
    elif p == Pattern.TILE_TRUNCATED:
        t = relation.tile
        shown = also = oracle // t * t if relation.rounding == Rounding.DOWN else (oracle + t - 1) // t * t
    else:  # SHIFTED_REQUEST
        source = b - relation.shift
        free = (source < 0) | (source >= len(seq_lens))
        shown = also = torch.where(free, oracle, row_limits(seq_lens, next_n)[source.clamp(0, len(seq_lens) - 1), j])
    return shown.clamp(0, width), also.clamp(0, width), free


@st.composite
def _drawn(draw: st.DrawFn, pattern: Pattern) -> tuple[Relation, torch.Tensor, int, int, tuple[int, ...], torch.Tensor]:
    """A relation of `pattern` with its parameters, a case (lengths, next_n, width, tiles) and the limits a
    kernel following it exactly shows (row 0 of the mirrored form at L where a tile divides L, sometimes)."""
    width = draw(st.integers(8, 80))
    next_n = draw(st.integers(2 if pattern in _NEEDS_DRAFT_ROWS else 1, 4))
    seq_lens = torch.tensor(draw(st.lists(st.integers(0, width), min_size=2 if pattern == Pattern.SHIFTED_REQUEST
                                          else 1, max_size=6)))
    tiles = tuple(draw(st.sets(st.sampled_from([2, 4, 8, 16]), min_size=pattern == Pattern.TILE_TRUNCATED)))
    relation = Relation(pattern)
    if pattern == Pattern.CONSTANT_OFFSET:
        relation = Relation(pattern, offset=draw(st.integers(-5, 5).filter(bool)))
    elif pattern == Pattern.TILE_TRUNCATED:
        tile, rounding = draw(st.sampled_from(sorted(tiles))), draw(st.sampled_from(Rounding))
        relation = Relation(pattern, tile=tile, rounding=rounding)
    elif pattern == Pattern.SHIFTED_REQUEST:
        relation = Relation(pattern, shift=draw(st.integers(1 - len(seq_lens), len(seq_lens) - 1).filter(bool)))
    elif pattern == Pattern.ROTATED_DRAFT_ROWS:
        relation = Relation(pattern, shift=draw(st.sampled_from(sorted({1, next_n - 1}))))
    shown, also, _ = _follows(relation, seq_lens, next_n, width, tiles)
    pick = torch.tensor(draw(st.lists(st.booleans(), min_size=len(shown), max_size=len(shown))))
    return relation, seq_lens, next_n, width, tiles, torch.where(pick, also, shown)


_NEEDS_DRAFT_ROWS = (Pattern.PER_SEQUENCE_LENGTH, Pattern.ROTATED_DRAFT_ROWS, Pattern.REVERSED_DRAFT_ROWS,
                     Pattern.MTP_MIRRORED)
FITTED = [Pattern.CONSTANT_OFFSET, *_NEEDS_DRAFT_ROWS, Pattern.TILE_TRUNCATED, Pattern.SHIFTED_REQUEST]


def _explain_kernel(kernel: torch.Tensor, seq_lens: torch.Tensor, next_n: int, width: int,
                    tiles: tuple[int, ...]) -> Explanation | None:
    """explain() of a kernel whose rows show `kernel`, as compare() records them (tail checked)."""
    oracle = _rows(seq_lens, next_n)[3]
    wrong = [r for r in range(len(oracle)) if kernel[r] != oracle[r]]
    limits = [(r, int(oracle[r]), int(kernel[r])) for r in wrong]
    return explain(limits, next_n, oracle, width=width, wrong_rows=wrong, tiles=tiles)


def _identifiable(kernel: torch.Tensor, oracle: torch.Tensor, width: int) -> bool:
    """Some wrong row shows a limit inside (0, width): where every wrong row is empty or full, no window
    and an uncleaned tail are named first, whatever the kernel computes."""
    wrong = kernel != oracle
    return bool(wrong.any() and ((kernel > 0) & (kernel < width) & wrong).any())


@pytest.mark.parametrize("pattern", FITTED, ids=lambda p: p.value)
@given(data=st.data())
def test_a_relation_followed_exactly_is_named_with_its_parameters_and_whatever_is_named_fits(pattern, data):
    relation, seq_lens, next_n, width, tiles, kernel = data.draw(_drawn(pattern))
    assume(_identifiable(kernel, _rows(seq_lens, next_n)[3], width))
    explanation = _explain_kernel(kernel, seq_lens, next_n, width, tiles)
    assert relation in (explanation.relation, *explanation.alternatives), f"{relation=} {explanation=}"
    assert explanation.explained == explanation.rows and not explanation.selective
    for named in (explanation.relation, *explanation.alternatives):
        shown, also, free = _follows(named, seq_lens, next_n, width, tiles)
        assert bool(((kernel == shown) | (kernel == also) | free).all()), f"{named=} does not give {kernel=}"


@pytest.mark.parametrize("pattern", FITTED, ids=lambda p: p.value)
@given(data=st.data())
def test_one_row_off_a_relation_is_never_named_as_it(pattern, data):
    relation, seq_lens, next_n, width, tiles, kernel = data.draw(_drawn(pattern))
    shown, also, free = _follows(relation, seq_lens, next_n, width, tiles)
    rows = [r for r in range(len(kernel)) if not free[r]]
    row = data.draw(st.sampled_from(rows))
    value = data.draw(st.integers(0, width).filter(lambda v: v not in (int(shown[row]), int(also[row]))))
    kernel = kernel.clone()
    kernel[row] = value
    explanation = _explain_kernel(kernel, seq_lens, next_n, width, tiles)
    assume(explanation is not None)
    # The row made right again may leave the same offset on the other rows: named as holding on those alone.
    assert not (explanation.relation == relation and not explanation.selective), f"{relation=} {explanation=}"
    assert relation not in explanation.alternatives, f"{relation=} {explanation=}"


# --------------------------------------------------------------------------- planted kernels, end to end

CASES = [build_case(TINY.replace(next_n=3, lengths=(5, 9, 0, 20, 2, 1)), s) for s in range(2)]


@pytest.fixture(scope="module")
def planted_results():
    kernels = [ub.mirrored_mtp_window, ub.sequence_length_for_every_row, ub.window_one_short,
               planted.block_boundary_off_by_one]
    return run([FunctionBackend.from_function(k) for k in kernels], CASES, RunConfig())


@pytest.mark.parametrize(("backend", "pattern", "words"), [
    ("mirrored-mtp-window", Pattern.MTP_MIRRORED, "AITER's mirrored MTP window: row j sees L - j + 1 positions"),
    ("sequence_length_for_every_row", Pattern.PER_SEQUENCE_LENGTH, "per-sequence length: each row of a request"),
    ("window-one-short", Pattern.CONSTANT_OFFSET, "constant offset -1"),
    ("planted-block-boundary", Pattern.CONSTANT_OFFSET, "a condition picks the rows"),
])
def test_planted_kernels_fail_with_their_pattern_named(planted_results, backend, pattern, words):
    mine = [r for r in planted_results if r.backend == backend]
    assert mine and all(r.verdict == Verdict.FAIL_MASK for r in mine), [r.verdict for r in mine]
    for result in mine:
        assert result.comparison is not None and result.comparison.explanation is not None
        assert result.comparison.explanation.pattern == pattern, result.comparison.explanation
    text = render_failures(mine)
    assert f"pattern: ({len(mine[0].comparison.mask_limits)} of" in text and words in text, text
    assert "kernel behaved as" in text and "mask: row " in text and "wrong draft rows: j = " in text, text


def test_the_new_comparison_fields_survive_json(planted_results):
    for result in planted_results:
        back = CaseResult.from_json(json.loads(json.dumps(to_jsonable(result))), "result.")
        assert back == result, f"{back.comparison=}\n{result.comparison=}"


@pytest.mark.parametrize(("old", "relation"), [
    ("shifted-by-one-request", Relation(Pattern.SHIFTED_REQUEST)),
    ("mtp-mirrored", Relation(Pattern.MTP_MIRRORED)),
    ("constant-offset", Relation(Pattern.CONSTANT_OFFSET)),
])
def test_an_older_reports_explanation_reads_as_its_relation_without_parameters(planted_results, old, relation):
    data = json.loads(json.dumps(to_jsonable(planted_results[0])))
    data["comparison"]["explanation"] = {"pattern": old, "description": "as an older difftest wrote it",
                                         "explained": 3, "rows": 3}
    for key in ("topk",):  # older reports had no top-k k either
        del data["comparison"][key]
    back = CaseResult.from_json(data, "result.")
    assert back.comparison.explanation == Explanation(relation, 3, 3) and back.comparison.topk == 2048
    assert render_failures([back]).count("pattern: (3 of 3 wrong rows) ") == 1


def test_the_cli_names_the_mirrored_window(capsys):
    main(["run", "--backends", "torch,tests.user_backends:mirrored_mtp_window", "--cases", "random",
          "--next-n", "3", "--heads", "4", "--head-dim", "16", "--no-progress"])
    out, err = capsys.readouterr()
    assert "FAIL(mask)" in out and "pattern: (" in out and "AITER's mirrored MTP window" in out, out + err
    assert "kernel behaved as" in out and "| where the oracle's window ends" in out, out


# --------------------------------------------------------------------------- the field's patterns, planted

AFTER_EMPTY_CASES = [build_case(TINY.replace(next_n=1, lengths=(5, 0, 20, 9, 0, 7)), 0),
                     build_case(TINY.replace(next_n=2, lengths=(5, 9, 0, 20, 2, 1)), 1)]


def test_the_request_after_an_empty_one_scored_with_its_q_is_named():
    """DeepGEMM 2.8.1's zero-length bug was FAIL(value) with no pattern: its rows are those of each request right
    after an empty one."""
    results = run([FunctionBackend.from_function(pp.scored_with_the_empty_requests_q)], AFTER_EMPTY_CASES,
                  RunConfig())
    for result in results:
        assert result.verdict == Verdict.FAIL_VALUE and not result.comparison.mask_rows, result.verdict
        assert result.comparison.explanation.relation == Relation(Pattern.AFTER_EMPTY_REQUEST), result.comparison
    assert "the request after an empty one: every wrong row is in a request right after an empty one" in \
        render_failures(results)


def test_wrong_values_elsewhere_have_no_pattern():
    oracle = torch.tensor([5, 0, 7, 3])
    assert explain([], 1, oracle, value_rows=[2, 3]) is None, "row 3 follows no empty request"
    assert explain([], None, oracle, value_rows=[2]) is None, "no requests known: nothing to say"
    assert explain([], 1, oracle, value_rows=[2]).relation == Relation(Pattern.AFTER_EMPTY_REQUEST)


@pytest.mark.parametrize(("next_n", "alternatives"), [(2, (Relation(Pattern.REVERSED_DRAFT_ROWS),)), (3, ())])
def test_a_draft_row_off_by_one_is_named_so_not_reversed_draft_rows(next_n, alternatives):
    """At next_n 2 a draft index off by one (wrapping) gives the rows of the reversed ones: named as the off by
    one, the reversal listed as also fitting; at next_n 3 they differ."""
    case = build_case(TINY.replace(next_n=next_n, lengths=(5, 9, 0, 20, 2, 1)), 0)
    [result] = run([FunctionBackend.from_function(pp.draft_row_off_by_one)], [case], RunConfig())
    explanation = result.comparison.explanation
    assert explanation.relation == Relation(Pattern.ROTATED_DRAFT_ROWS, shift=1), explanation
    assert explanation.alternatives == alternatives
    assert "rotated draft rows (j + 1): row j sees the window of row (j + 1) mod next_n" in render_failures([result])
