"""Fuzz signatures by root cause: one planted bug is one signature, however its cases show it (which draft
row fails first, which shape); its variants are counted under it."""

from __future__ import annotations

import pytest

from difftest.backends import as_loaded
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.explain import Pattern, Relation
from difftest.engine.operation_run import Drawn, Named, run_operation
from difftest.engine.topk_comparison import TopkPattern
from difftest.generators import build_case
from difftest.generators.regime import Regime
from difftest.generators.topk import TopkSpec, WindowDist
from difftest.operations.topk import TOPK
from difftest.workflows.fuzz import Campaign, fuzz, render_campaign
from difftest.workflows.running import run_one
from difftest.workflows.signatures import Signature, Variants, signature
from tests import planted, planted_patterns
from tests.planted_patterns import RelativeForAbsolute
from tests.support import TINY
from tests.user_backends import raises

BLOCK_BOUNDARY = as_loaded(planted.block_boundary_off_by_one)
# Each case puts the first row whose limit is a multiple of the block size (16) on another draft row.
CASES = [(2, (16, 40)),  # limits 15, 16 | 39, 40: draft row 1
         (2, (33, 5)),  # 32, 33 | 4, 5: draft row 0
         (1, (32, 7)),  # 32 | 7: draft row 0, next_n 1
         (4, (18, 3))]  # 15, 16, 17, 18 | ...: draft row 1, next_n 4


@pytest.fixture(scope="module")
def block_boundary_results():
    cases = [build_case(TINY.replace(next_n=next_n, lengths=lengths, block_size=16, max_model_len=64), 0)
             for next_n, lengths in CASES]
    return [(run_one(BLOCK_BOUNDARY, case, RunConfig()), case) for case in cases]


def test_one_bug_is_one_signature_whatever_draft_row_fails_first(block_boundary_results):
    signatures = {signature(result) for result, _case in block_boundary_results}
    assert len(signatures) == 1, signatures
    (only,) = signatures
    assert only.backend == "planted-block-boundary" and only.verdict == Verdict.FAIL_MASK
    assert only.relation is not None, "the explainer named the relation of the wrong windows"


def test_the_variants_count_draft_rows_kinds_and_shapes(block_boundary_results):
    variants = Variants()
    for result, case in block_boundary_results:
        variants.add(result, case)
    assert variants.draft_rows == {1: 2, 0: 2}
    assert variants.kinds == {"mask": 4}
    assert set(variants.shapes) == {f"next_n {n}, H 2, D 16, block 16" for n in (1, 2, 4)}
    assert variants.describe().startswith("draft rows 1 (2), 0 (2); rows mask (4); shapes ")
    merged = Variants()
    merged.merge(variants)
    merged.merge(variants)
    assert merged.to_json()["draft_rows"] == {"1": 4, "0": 4}


def test_an_error_is_signed_by_its_exception_type():
    result = run_one(as_loaded(raises), build_case(TINY, 0), RunConfig())
    assert signature(result) == Signature("raises", Verdict.ERROR, None, "RuntimeError")
    assert signature(result).describe() == "raises: ERROR, raised RuntimeError"


def test_a_campaign_finds_one_signature_for_one_bug_with_its_variants_listed():
    # The old signature (draft row of the first wrong row, kinds of wrong rows) split this bug four ways.
    outcome = fuzz(Campaign(budget=3.0, backends=("tests.planted:block_boundary_off_by_one",), shrink_seconds=0,
                            regime=Regime(max_batch=4, max_context=64, block_size=16)))
    text = render_campaign(outcome)
    [found] = outcome.found
    assert found.seen > 1 and len(found.variants.draft_rows) >= 2, text
    assert "    variants: draft rows " in text and "1 distinct failures" in text


def test_the_request_after_an_empty_one_is_one_signature_apart_from_other_wrong_values():
    """Its FAIL(value) results were one signature with every other wrong-value bug of the backend; now its
    pattern signs them, on any case, and a value bug without a pattern keeps the plain signature."""
    empty = as_loaded(planted_patterns.scored_with_the_empty_requests_q)
    cases = [build_case(TINY.replace(next_n=next_n, lengths=lengths), 0)
             for next_n, lengths in ((1, (5, 0, 20, 9)), (2, (9, 0, 7, 0, 12)))]
    signs = {signature(run_one(empty, case, RunConfig())) for case in cases}
    assert signs == {Signature(empty.name, Verdict.FAIL_VALUE, Relation(Pattern.AFTER_EMPTY_REQUEST))}, signs
    other = signature(run_one(as_loaded(planted.weights_of_next_head), cases[0], RunConfig()))
    assert other.verdict == Verdict.FAIL_VALUE and other.relation is None


def test_a_top_k_signature_carries_the_pattern_of_its_selection():
    backend = Named(RelativeForAbsolute.name, RelativeForAbsolute())
    cases = [Drawn(TOPK.build(TopkSpec(rows=4, width=96, k=8, windows=WindowDist.RAGGED), seed, "cpu"))
             for seed in (1, 2)]
    results = run_operation(TOPK, [backend], cases, RunConfig())
    assert {signature(r) for r in results} == {Signature(backend.name, Verdict.FAIL_OUT_OF_WINDOW,
                                                         selection=TopkPattern.ROW_RELATIVE_FOR_ABSOLUTE)}
    assert "row-relative-for-absolute" in signature(results[0]).describe()
