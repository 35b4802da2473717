"""Failures that explain themselves: each wrong-mask row's limits, the pattern across a case, the mask strip.

Synthetic logits give each pattern exactly; planted kernels give it through the runner, the report and
the CLI; the new Comparison fields survive a JSON round trip.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from difftest.backends.user import FunctionBackend
from difftest.cli import main
from difftest.core import schema
from difftest.core.case import row_limits
from difftest.core.contract import Contract
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.poison import poisoned
from difftest.core.verdict import Verdict
from difftest.engine import comparison
from difftest.engine.comparison import MASK_LIMITS, compare
from difftest.engine.config import RunConfig
from difftest.engine.explain import Pattern, explain
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.records.report import render_failures
from difftest.records.serialize import result_from_json, to_jsonable
from tests import planted
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


def _pattern_of(kernel_limits: torch.Tensor, **kwargs) -> Pattern:
    result = _compared(kernel_limits, **kwargs)
    assert result.verdict == Verdict.FAIL_MASK and result.explanation is not None, f"{result=}"
    assert result.explanation.explained == len(result.mask_limits), f"{result.explanation=}"
    return result.explanation.pattern


def test_each_wrong_row_records_the_oracle_limit_and_the_kernels():
    lens = _oracle()
    result = _compared((lens - 1).clamp(min=0))
    assert result.mask_rows == [r for r in range(len(lens)) if lens[r] > 0]
    assert result.mask_limits == tuple((r, int(lens[r]), int(lens[r]) - 1) for r in result.mask_rows)


def test_the_mirrored_mtp_window_is_named():
    lengths, j = _layout()
    assert _pattern_of(lengths - j + 1) == Pattern.MTP_MIRRORED


def test_the_mirrored_window_without_its_phantom_is_still_named():
    """AITER writes the phantom 0.0 at p = L only when a processed chunk holds it: row 0 may stop at L."""
    lengths, j = _layout()
    mirrored = lengths - j + 1
    mirrored[::2 * NEXT_N] = lengths[::2 * NEXT_N]  # the row 0 of every other request stops at L
    assert _pattern_of(mirrored) == Pattern.MTP_MIRRORED


def test_the_mirrored_window_under_an_unchecked_tail_is_named_from_the_rows_it_shortens():
    lengths, j = _layout()
    result = _compared(lengths - j + 1, contract=LOOSE_TAIL)
    # Only row j = 2 loses keys (row 0 sees more, row 1 the same at next_n 3, where L - 1 + 1 = L - 1 + 1).
    assert result.mask_rows and all(row % NEXT_N == 2 for row in result.mask_rows), f"{result.mask_rows=}"
    assert result.explanation is not None and result.explanation.pattern == Pattern.MTP_MIRRORED


def test_the_sequence_length_for_every_row_is_named():
    lengths, _ = _layout()
    assert _pattern_of(lengths) == Pattern.PER_SEQUENCE_LENGTH


def test_a_constant_offset_is_named_with_its_offset():
    result = _compared(_oracle() - 1)
    assert result.explanation is not None and result.explanation.pattern == Pattern.CONSTANT_OFFSET
    assert "constant offset -1" in result.explanation.description
    assert "window one short" in result.explanation.description
    assert _pattern_of(_oracle() + 2) == Pattern.CONSTANT_OFFSET


@pytest.mark.parametrize("shift", [1, -1])
def test_rows_shifted_by_one_request_are_named(shift):
    table = _oracle().reshape(-1, NEXT_N)
    shifted = torch.roll(table, shifts=shift, dims=0).reshape(-1)  # request 0 (or the last) gets the far end's
    result = _compared(shifted)
    assert result.explanation is not None and result.explanation.pattern == Pattern.SHIFTED_BY_ONE_REQUEST
    assert (f"b {'-' if shift == 1 else '+'} 1's limits") in result.explanation.description


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
    result = _compared(kernel)
    assert result.explanation is not None and result.explanation.pattern == Pattern.UNKNOWN
    assert "+1 on 1" in result.explanation.description and "-3 on 1" in result.explanation.description


def test_without_next_n_only_request_free_patterns_are_tried():
    lengths, j = _layout()
    assert _pattern_of(_oracle() - 1, next_n=None) == Pattern.CONSTANT_OFFSET
    result = _compared(lengths - j + 1, next_n=None)
    assert result.explanation is not None and result.explanation.pattern == Pattern.UNKNOWN


def test_a_mask_with_holes_has_no_apparent_limit_and_the_strip_shows_it():
    lens = _oracle()
    got = _logits(lens)
    row = int(torch.nonzero(lens >= 10)[0])
    got[row, 4] = float("-inf")  # a hole inside the window: -inf between values
    result = compare(_logits(lens), got, lens, STRICT, next_n=NEXT_N)
    assert result.mask_limits == ((row, int(lens[row]), None),)
    assert result.mask_strip is not None and "kernel not a prefix" in result.mask_strip
    assert "vvvv-vvvvv" in result.mask_strip, result.mask_strip


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
    # The top-k mean sums the rows in another order: its last bit may differ.
    assert dataclasses.replace(chunked, topk_overlap=whole.topk_overlap) == whole
    assert whole.explanation is not None and whole.explanation.pattern == Pattern.CONSTANT_OFFSET


def test_explain_without_wrong_rows_is_none():
    assert explain((), NEXT_N, _oracle()) is None


def test_the_schema_restates_the_patterns_and_the_cap():
    assert schema.MASK_PATTERNS == tuple(p.value for p in Pattern)
    assert schema.MASK_LIMITS == MASK_LIMITS


# --------------------------------------------------------------------------- planted kernels, end to end

CASES = [build_case(TINY.replace(next_n=3, lengths=(5, 9, 0, 20, 2, 1)), s) for s in range(2)]


@pytest.fixture(scope="module")
def planted_results():
    kernels = [ub.mirrored_mtp_window, ub.sequence_length_for_every_row, ub.window_one_short,
               planted.block_boundary_off_by_one]
    return run([FunctionBackend.from_function(k) for k in kernels], CASES, RunConfig())


@pytest.mark.parametrize(("backend", "pattern", "words"), [
    ("mirrored-mtp-window", Pattern.MTP_MIRRORED, "MTP window mirrored"),
    ("sequence_length_for_every_row", Pattern.PER_SEQUENCE_LENGTH, "per-sequence length used for every row"),
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
    assert "kernel behaved as" in text and "mask: row " in text, text


def test_the_new_comparison_fields_survive_json(planted_results):
    for result in planted_results:
        back = result_from_json(json.loads(json.dumps(to_jsonable(result))))
        assert back == result, f"{back.comparison=}\n{result.comparison=}"


def test_the_cli_names_the_mirrored_window(capsys):
    main(["run", "--backends", "torch,tests.user_backends:mirrored_mtp_window", "--cases", "random",
          "--next-n", "3", "--heads", "4", "--head-dim", "16", "--no-progress"])
    out, err = capsys.readouterr()
    assert "FAIL(mask)" in out and "pattern: (" in out and "MTP window mirrored" in out, out + err
    assert "kernel behaved as" in out and "| where the oracle's window ends" in out, out
