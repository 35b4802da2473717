"""compare_topk: any right answer passes (any choice among the ties, any order where none is promised, each
padding convention), and each planted corruption is caught with its verdict."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from difftest.core.kinds import IndexConvention, NanRanking, TopkPadding, WindowForm
from difftest.core.topk import TopkCase, TopkContract, encode_topk
from difftest.core.verdict import Verdict
from difftest.engine.topk_comparison import TopkPattern, compare_topk
from difftest.generators.topk import Outside, TopkSpec, TopkValues, WindowDist, build_topk_case
from difftest.oracles.topk import rank_values, reference
from tests.planted_patterns import RelativeForAbsolute
from tests.planted_topk import PLANTED

CONVENTIONS = [(index, padding) for index in IndexConvention for padding in TopkPadding
               if not (padding == TopkPadding.OUTSIDE_COLUMNS and index == IndexConvention.ROW_RELATIVE)]


@st.composite
def problems(draw: st.DrawFn) -> tuple[TopkCase, TopkContract, random.Random]:
    """A small case of integer values (ties everywhere), some -inf (and NaN), windows anywhere; a contract of
    any convention. Shrinks towards fewer rows, narrower rows and smaller k."""
    index, padding = draw(st.sampled_from(CONVENTIONS))
    contract = TopkContract(index, padding, WindowForm.STARTS_ENDS, sorted=draw(st.booleans()),
                            nan=draw(st.sampled_from(list(NanRanking))))
    width = draw(st.integers(1, 24))
    spec = TopkSpec(rows=draw(st.integers(1, 5)), width=width, k=draw(st.integers(1, 12)),
                    values=draw(st.sampled_from([TopkValues.INTEGER, TopkValues.EQUAL, TopkValues.NORMAL])),
                    finite=(draw(st.integers(0, width)), width), nans=draw(st.sampled_from([0, 0, 1])),
                    windows=draw(st.sampled_from(list(WindowDist))), outside=draw(st.sampled_from(list(Outside))))
    return build_topk_case(spec, draw(st.integers(0, 1000))), contract, random.Random(draw(st.integers(0, 1000)))


def right_answer(case: TopkCase, contract: TopkContract, rng: random.Random) -> torch.Tensor:
    """A right answer chosen at random among all right ones under `contract`: any `equal` members, any
    order (descending where promised), the convention's padding or fills."""
    ranks = rank_values(case.logits, contract.nan).tolist()
    rows = []
    for row in range(case.rows):
        start, end = int(case.starts[row]), int(case.ends[row])
        window = list(range(start, end))
        rng.shuffle(window)  # a random choice among equal values: sorted() below is stable
        candidates = sorted((c for c in window if ranks[row][c] > -math.inf), key=lambda c: -ranks[row][c])
        chosen = candidates[:case.k]
        fills = _fills(case, contract, row, window, candidates, rng)
        if not contract.sorted:
            rng.shuffle(chosen)
        picks = chosen + fills[:case.k - len(chosen)]
        slots = [c - start if contract.index == IndexConvention.ROW_RELATIVE else c for c in picks]
        rows.append(slots + [-1] * (case.k - len(slots)))
    return torch.tensor(rows, dtype=torch.int32).reshape(case.rows, case.k)


def _fills(case: TopkCase, contract: TopkContract, row: int, window: list[int], candidates: list[int],
           rng: random.Random) -> list[int]:
    """What fills the slots the candidates leave: nothing (-1), the window's other positions, or any
    non-candidate index (outside the window, -inf inside it, past the width)."""
    others = [c for c in window if c not in set(candidates)]
    if contract.padding == TopkPadding.PAST_CANDIDATES:
        return []
    if contract.padding == TopkPadding.PAST_WINDOW:
        return others
    start, end = int(case.starts[row]), int(case.ends[row])
    outside = [c for c in range(case.width) if not start <= c < end]
    pool = others + outside + list(range(case.width, case.width + case.k))
    rng.shuffle(pool)
    return pool


@given(problems())
def test_every_right_answer_passes(problem):
    case, contract, rng = problem
    result = compare_topk(reference(case, contract.nan), right_answer(case, contract, rng), case, contract)
    assert result.verdict == Verdict.PASS, (case, contract, result.headline())
    assert result.wrong_rows == () and result.first_mismatch is None


def _corrupt(kind: Verdict, answer: torch.Tensor, case: TopkCase, contract: TopkContract,
             rng: random.Random) -> tuple[torch.Tensor, int] | None:
    """`answer` with one planted corruption of `kind` and its row, or None where this case has no room for one."""
    truth = reference(case, contract.nan)
    relative = contract.index == IndexConvention.ROW_RELATIVE
    ranks = rank_values(case.logits, contract.nan)
    for row in rng.sample(range(case.rows), case.rows):
        start, end, need = int(case.starts[row]), int(case.ends[row]), int(truth.need[row])
        got = answer[row].tolist()
        as_column = [g + start if relative and g != -1 else g for g in got]
        real = [s for s, c in enumerate(as_column) if c != -1 and start <= c < end and ranks[row, c] > -math.inf]
        out = answer.clone()
        if kind == Verdict.FAIL_GARBAGE:
            out[row, 0] = -(10 ** 9)
        elif kind == Verdict.FAIL_OUT_OF_WINDOW and real and (start > 1 or end < case.width):
            column = end if end < case.width else start - 2  # relative start - 1 would read as the -1 pad
            out[row, real[0]] = column - start if relative else column
        elif kind == Verdict.FAIL_DUPLICATE and len(real) >= 2:
            out[row, real[1]] = out[row, real[0]]
        elif kind == Verdict.FAIL_PADDING and real:
            out[row, real[0]] = -1
        elif kind == Verdict.FAIL_MISSING and real and need:
            kth = truth.kth[row]
            left = [c for c in range(start, end) if c not in as_column and -math.inf < ranks[row, c] < kth]
            if not left:
                continue
            out[row, real[0]] = left[0] - start if relative else left[0]
        elif kind == Verdict.FAIL_ORDER and contract.sorted and len(real) >= 2:
            a, b = real[0], real[-1]
            if ranks[row, as_column[a]] == ranks[row, as_column[b]]:
                continue
            out[row, a], out[row, b] = answer[row, b], answer[row, a]
        else:
            continue
        return out, row
    return None


@pytest.mark.parametrize("kind", [Verdict.FAIL_GARBAGE, Verdict.FAIL_OUT_OF_WINDOW, Verdict.FAIL_DUPLICATE,
                                  Verdict.FAIL_PADDING, Verdict.FAIL_MISSING, Verdict.FAIL_ORDER])
@given(problem=problems())
def test_each_planted_corruption_is_caught(kind, problem):
    case, contract, rng = problem
    contract = contract if contract.nan == NanRanking.HIGHEST or kind in (
        Verdict.FAIL_GARBAGE, Verdict.FAIL_OUT_OF_WINDOW, Verdict.FAIL_DUPLICATE) else \
        TopkContract(contract.index, contract.padding, contract.window, sorted=contract.sorted, nan=NanRanking.HIGHEST)
    planted = _corrupt(kind, right_answer(case, contract, rng), case, contract, rng)
    if planted is None:
        return  # this case has no room for the corruption (hypothesis draws others)
    corrupted, row = planted
    result = compare_topk(reference(case, contract.nan), corrupted, case, contract)
    assert result.row_verdict(row) == kind, (kind, case, contract, row, result.headline(), result.symptoms)
    assert kind in result.symptoms and result.first_mismatch is not None
    assert (row in result.wrong_rows) == (kind != Verdict.FAIL_ORDER), result


def test_headline_counts_rows_and_tokens():
    case = build_topk_case(TopkSpec(rows=3, width=40, k=5, windows=WindowDist.FULL), 2)
    contract = TopkContract(IndexConvention.ABSOLUTE, TopkPadding.PAST_CANDIDATES, WindowForm.STARTS_ENDS)
    answer = right_answer(case, contract, random.Random(0))
    answer[1, :2] = -1  # two tokens of row 1 lost
    result = compare_topk(reference(case), answer, case, contract)
    assert result.wrong_rows == (1,) and result.wrong_tokens == (2,), result
    assert result.headline().startswith("1/3 rows select a wrong set (2 tokens); first: row 1 slot 0: FAIL(padding)")


def test_float_indices_with_nan_are_garbage():
    case = build_topk_case(TopkSpec(rows=2, width=8, k=2, windows=WindowDist.FULL), 0)
    contract = TopkContract(IndexConvention.ABSOLUTE, TopkPadding.PAST_CANDIDATES, WindowForm.STARTS_ENDS)
    answer = right_answer(case, contract, random.Random(0)).double()
    answer[0, 1] = math.nan
    answer[1, 0] += 0.5
    result = compare_topk(reference(case), answer, case, contract)
    assert result.rows_by_verdict == {Verdict.FAIL_GARBAGE: (0, 1)}, result


def test_wrong_shape_is_a_value_error():
    case = build_topk_case(TopkSpec(rows=2, width=8, k=2), 0)
    contract = TopkContract(IndexConvention.ABSOLUTE, TopkPadding.PAST_CANDIDATES, WindowForm.STARTS_ENDS)
    with pytest.raises(ValueError, match="shape"):
        compare_topk(reference(case), torch.zeros(2, 3, dtype=torch.int32), case, contract)


def test_nan_rows_under_undefined_ranking_are_judged_on_safety_alone():
    case = build_topk_case(TopkSpec(rows=2, width=16, k=4, windows=WindowDist.FULL, nans=2), 0)
    contract = TopkContract(IndexConvention.ABSOLUTE, TopkPadding.PAST_CANDIDATES, WindowForm.STARTS_ENDS,
                            nan=NanRanking.UNDEFINED)
    any_columns = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    result = compare_topk(reference(case, contract.nan), any_columns, case, contract)
    assert result.verdict == Verdict.PASS and result.safety_rows == (0, 1), result
    any_columns[1, 3] = 4
    assert compare_topk(reference(case, contract.nan), any_columns, case, contract).verdict == Verdict.FAIL_DUPLICATE


def _prefill_case() -> TopkCase:
    return build_topk_case(TopkSpec(rows=4, width=96, k=8, windows=WindowDist.RAGGED, outside=Outside.HOSTILE), 3)


def test_row_relative_indices_for_an_absolute_contract_are_named():
    planted = RelativeForAbsolute()
    case = _prefill_case()
    got = planted(encode_topk(case, planted.contract), None)
    result = compare_topk(reference(case), got, case, planted.contract)
    assert result.verdict.failed and result.pattern == TopkPattern.ROW_RELATIVE_FOR_ABSOLUTE, result.headline()
    assert "pattern: every index lower by its row's start (row-relative indices for an absolute contract)" in \
        result.headline()


def test_absolute_indices_for_a_row_relative_contract_are_named_and_other_bugs_are_not():
    case = _prefill_case()
    for planted, pattern in ((PLANTED[1][0], TopkPattern.ABSOLUTE_FOR_ROW_RELATIVE), (PLANTED[3][0], None)):
        got = planted(encode_topk(case, planted.contract), None)
        result = compare_topk(reference(case), got, case, planted.contract)
        assert result.verdict.failed and result.pattern == pattern, (planted.name, result.headline())
