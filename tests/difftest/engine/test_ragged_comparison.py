"""The ragged comparison: every right answer passes in both output forms (hypothesis over drawn cases), each kind
of corruption is named, rotation keeps every bit, and a failure is told in keys."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from difftest.core.kinds import LogitsForm, MaskConvention, OracleKind
from difftest.core.poison import POISON_BITS, bits, poisoned
from difftest.core.ragged import RaggedContract, RaggedTiles
from difftest.core.verdict import Verdict
from difftest.engine.ragged_comparison import compare_ragged, rotated
from difftest.generators.ragged import RaggedSpec, RaggedWindows, build_ragged_case
from difftest.oracles.ragged_mqa_logits import absolute, reference
from difftest.oracles.ragged_reference import make_ragged_reference

ABSOLUTE = RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF)
RELATIVE = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_UNSPECIFIED, tiles=RaggedTiles(kv=(64,)))
CLEAN_RELATIVE = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_NEG_INF)


def _right(case, contract) -> torch.Tensor:
    """float32 logits in the contract's form, as a right kernel writes them (window-relative: garbage tail where
    the contract lets it be)."""
    relative = reference(case, contract.width(case) if contract.form == LogitsForm.WINDOW_RELATIVE else None)
    if contract.form == LogitsForm.ABSOLUTE:
        return absolute(relative, case.k_start, case.keys).float()
    if contract.mask == MaskConvention.TAIL_UNSPECIFIED:
        relative = torch.where(torch.isneginf(relative), 12345.0, relative)
    return relative.float()


@given(st.integers(1, 9), st.integers(1, 90), st.sampled_from(list(RaggedWindows)), st.integers(0, 2 ** 16),
       st.sampled_from([ABSOLUTE, RELATIVE, CLEAN_RELATIVE]), st.booleans())
def test_every_right_answer_passes(rows, keys, windows, seed, contract, fast):
    spec = RaggedSpec(rows=rows, keys=max(keys, rows), heads=2, head_dim=16, windows=windows,
                      requests=min(2, rows))
    case = build_ragged_case(spec, seed)
    oracle = OracleKind.FAST if fast else OracleKind.EXACT
    result = compare_ragged(make_ragged_reference(case, contract.width(case), oracle), _right(case, contract), case,
                            contract)
    assert result.verdict == Verdict.PASS, result.headline()


def _staircase():
    return build_ragged_case(RaggedSpec(rows=6, keys=40, heads=2, head_dim=16, windows=RaggedWindows.STAIRCASE,
                                        contexts=(3, 20), query_lens=(2, 4)), 0)


def _judge(got, case, contract):
    return compare_ragged(make_ragged_reference(case, contract.width(case)), got, case, contract)


def test_a_finite_value_before_the_window_is_a_mask_failure_told_in_keys():
    case = _staircase()  # the second request's rows start at key 5
    got = _right(case, ABSOLUTE)
    got[3, 4] = 1.0
    result = _judge(got, case, ABSOLUTE)
    assert result.verdict == Verdict.FAIL_MASK and result.comparison.mask_rows == [3], result.headline()
    assert "row 3 key 4 (window [5, 27))" in result.headline(), result.headline()


def test_each_kind_of_corruption_is_named():
    case = _staircase()
    lens = case.window_lens().tolist()
    right = _right(case, CLEAN_RELATIVE)
    cases = {Verdict.FAIL_MASK: (1, lens[1], 0.5), Verdict.FAIL_NAN: (2, 0, math.nan),
             Verdict.FAIL_VALUE: (4, 3, float(right[4, 3]) + 100.0)}
    for verdict, (row, column, value) in cases.items():
        got = right.clone()
        got[row, column] = value
        result = _judge(got, case, CLEAN_RELATIVE)
        assert result.verdict == verdict and result.comparison.first_mismatch.row == row, result.headline()
    inside_inf = right.clone()
    inside_inf[5, 0] = -math.inf
    assert _judge(inside_inf, case, CLEAN_RELATIVE).comparison.mask_rows == [5]
    unwritten = poisoned(tuple(right.shape), torch.float32, "cpu")
    unwritten[:, 1:] = right[:, 1:]
    assert _judge(unwritten, case, RELATIVE).verdict == Verdict.FAIL_UNWRITTEN


def test_the_tail_is_judged_only_where_the_contract_cleans():
    case = _staircase()
    garbage = _right(case, RELATIVE)  # 12345.0 past every window
    assert _judge(garbage, case, RELATIVE).verdict == Verdict.PASS
    result = _judge(garbage, case, CLEAN_RELATIVE)
    assert result.verdict == Verdict.FAIL_MASK and len(result.comparison.mask_rows) == 5, result.headline()


def test_a_row_padded_view_is_read_through_its_strides():
    case = _staircase()
    padded = torch.full((case.rows, 256), math.nan)
    padded[:, :case.seqlen_k] = _right(case, RELATIVE)
    assert _judge(padded[:, :case.seqlen_k], case, RELATIVE).verdict == Verdict.PASS


def test_rotation_keeps_every_bit_and_puts_the_window_first():
    got = poisoned((3, 7), torch.float32, "cpu")
    got[0, 2], got[1, 6], got[2, 0] = 1.0, -0.0, math.nan
    turned = rotated(got, torch.tensor([2, 6, 3]))
    assert float(turned[0, 0]) == 1.0 and str(float(turned[1, 0])) == "-0.0"
    assert turned[2, 4].isnan() and int(bits(turned)[0, 1]) == POISON_BITS[torch.float32][0]
    assert torch.equal(bits(rotated(turned, torch.tensor([5, 1, 4]))), bits(got))


def test_shapes_are_checked():
    case = _staircase()
    reference_ = make_ragged_reference(case, RELATIVE.width(case))
    with pytest.raises(ValueError, match="window-relative"):
        compare_ragged(reference_, torch.zeros(case.rows, case.keys), case, RELATIVE)
    with pytest.raises(ValueError, match="oracle"):
        compare_ragged(reference_, torch.zeros(case.rows, case.keys), case, ABSOLUTE)
