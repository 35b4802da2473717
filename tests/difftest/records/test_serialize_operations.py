"""Results of operations as JSON and back (a top-k or ragged result's violated relations too); a result written
before operations existed reads as paged logits."""

from __future__ import annotations

import pytest

from difftest.core import kinds
from difftest.core.errors import SpecError
from difftest.core.kinds import CacheLayout, LengthEncoding, OperationKind, TopkRelation
from difftest.core.schema import to_jsonable
from difftest.core.verdict import Verdict
from difftest.engine.result import CaseResult, RaggedViolation, Selection, TopkViolation, Violation


def _paged() -> CaseResult:
    return CaseResult(backend="torch", case="c", description="d", rows=4, verdict=Verdict.PASS, device="cpu",
                      encoding=LengthEncoding.PER_ROW, layout=CacheLayout.BLOCK_SPLIT, overridden=False, seconds=0.1)


def test_a_result_written_before_operations_reads_as_paged_logits():
    old = {k: v for k, v in to_jsonable(_paged()).items() if k not in ("operation", "selection", "headline")}
    assert CaseResult.from_json(old, "result.") == _paged()


def test_a_topk_result_round_trips_with_its_selection_and_its_own_spec():
    result = CaseResult(backend="torch-topk", case="c", description="d", rows=4, verdict=Verdict.FAIL_MISSING,
                        device="cpu", encoding=None, layout=None, overridden=False, seconds=0.1,
                        spec={"name": "x", "k": 8, "width": 64}, operation=OperationKind.TOPK, headline="1/4 rows",
                        selection=Selection(4, (2,), 3, {"FAIL(missing)": (2,)}, "row 2"))
    assert CaseResult.from_json(to_jsonable(result), "result.") == result


def test_a_topk_violation_round_trips_and_a_bad_field_of_it_is_named_at_its_path():
    violation = TopkViolation(TopkRelation.PERMUTE_COLUMNS, "c~permute-columns", (3,), 3, (9.0, 8.0), (9.0, 1.0), 0, 0,
                              0)
    result = CaseResult(backend="b", case="c", description="d", rows=4, verdict=Verdict.FAIL_METAMORPHIC,
                        device="cpu", encoding=None, layout=None, overridden=False, seconds=0.1,
                        operation=OperationKind.TOPK, metamorphic=(violation,))
    data = to_jsonable(result)
    assert CaseResult.from_json(data, "result.") == result
    data["metamorphic"][0]["related_pads"] = -2
    with pytest.raises(SpecError, match=r"^result\.metamorphic\[0\]\.related_pads=-2: expected an integer in "):
        CaseResult.from_json(data, "result.")


def test_a_ragged_violation_reads_back_as_one_though_its_relation_shares_a_paged_name():
    """scale-q is a paged relation's name and a ragged one's: a ragged violation is told by its `form`."""
    ragged = RaggedViolation(kinds.RaggedRelation.SCALE_Q, ("c~scale-q",), kinds.LogitsForm.WINDOW_RELATIVE, (1, 2),
                             1, 1, 7, 3.0, 5.0, 6.0, "q x 2")
    paged = Violation(kinds.MetamorphicRelation.SCALE_Q, ("c~scale-q",), (1,), 1, 7, 3.0, 5.0, 6.0, True, "q x 2")
    for operation, violation in ((OperationKind.RAGGED_LOGITS, ragged), (OperationKind.PAGED_LOGITS, paged)):
        result = CaseResult(backend="b", case="c", description="d", rows=4, verdict=Verdict.FAIL_METAMORPHIC,
                            device="cpu", encoding=None, layout=None, overridden=False, seconds=0.1,
                            operation=operation, metamorphic=(violation,))
        (read,) = CaseResult.from_json(to_jsonable(result), "result.").metamorphic
        assert read == violation and type(read.relation) is type(violation.relation)
    data = to_jsonable(ragged)
    data["form"] = "diagonal"
    with pytest.raises(SpecError, match=r"^form='diagonal': expected one of \['absolute', 'window-relative'\]"):
        RaggedViolation.from_json(data)
