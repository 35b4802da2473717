"""Metamorphic relations: every related case's oracle follows from the case's; a correct backend (torch, the
interpreted Triton kernel) keeps every relation; each relation is caught failing by a planted bug that the
oracle comparison also catches; a violation is FAIL(metamorphic) with the pair of cases, and shrinks."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given

from difftest.backends import as_loaded, get_backends, mutants
from difftest.core.kinds import Fp8Flavour, MaskConvention, MetamorphicRelation
from difftest.core.schema import to_jsonable
from difftest.core.spec import LengthDist, Stale, Values
from difftest.core.verdict import Verdict
from difftest.engine import metamorphic
from difftest.engine.config import RunConfig
from difftest.engine.isolate import InProcess
from difftest.engine.result import CaseResult
from difftest.generators import CaseSpec, build_case
from difftest.generators.strategies import specs
from difftest.oracles.paged_mqa_logits import reference
from difftest.workflows.running import run_one
from difftest.workflows.shrink import shrink
from tests import planted

R = MetamorphicRelation
# Small cases with every structure the relations move: several requests, draft rows, empty and full ones,
# shared and stale blocks, e4m3fnuz bytes, block size 1.
SPECS = [CaseSpec(name="edges", batch=4, next_n=2, length_dist=LengthDist.EDGES, padding=1, max_model_len=96),
         CaseSpec(name="shared", batch=3, next_n=3, values=Values.HEAVY, shared_blocks=True, extra_columns=1,
                  stale=Stale.OTHER, max_model_len=80),
         CaseSpec(name="fnuz", batch=2, next_n=1, fp8=Fp8Flavour.E4M3FNUZ, block_size=1, max_model_len=64)]


def _oracle_follows(case, relation) -> None:
    """The float64 oracle on the related cases equals the relation's image of the oracle on the case."""
    change = metamorphic.related(case, relation)
    if change is None:
        return
    related = torch.cat([reference(c) for c in change.cases])
    want = reference(case) * change.scale
    got = related[change.rows]
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{relation=}: the windows moved"
    error = float((got[finite] - want[finite]).abs().max()) if finite.any() else 0.0
    largest = float(want[finite].abs().max()) if finite.any() else 0.0
    # The float64 oracle itself scores a batch in chunks: a relation that changes the batch moves its roundings.
    assert error <= (0.0 if change.exact else 1e-12 * largest), f"{relation=}"
    others = torch.ones(related.shape[0], dtype=torch.bool)
    others[change.rows] = False
    assert not torch.isfinite(related[others]).any(), f"{relation=}: a padding row has a window"


@pytest.mark.parametrize("relation", list(R), ids=lambda r: r.value)
def test_every_related_case_has_the_logits_the_relation_says(relation):
    for spec in SPECS:
        _oracle_follows(build_case(spec, 7), relation)


@given(specs(max_batch=3, max_next_n=3, heads=(4, 32)))
def test_the_relations_hold_for_the_oracle_on_drawn_cases(spec):
    case = build_case(spec, 0)
    for relation in R:
        _oracle_follows(case, relation)


def test_relations_that_do_not_apply_change_nothing():
    one = build_case(CaseSpec(name="one", batch=1, next_n=1, heads=1, head_dim=16), 0)
    assert [r for r in R if metamorphic.related(one, r) is None] == [R.REORDER_REQUESTS, R.SPLIT_BATCH,
                                                                    R.FLATTEN_NEXT_N, R.PERMUTE_HEADS]


def test_scale_q_doubles_q_where_it_can_and_the_weights_where_it_cannot():
    normal = metamorphic.related(build_case(SPECS[0], 0), R.SCALE_Q)
    heavy = metamorphic.related(build_case(SPECS[1], 0), R.SCALE_Q)  # heavy values reach past 120
    assert normal.note == "q x 2" and heavy.note.startswith("weights x 2")
    assert torch.equal(heavy.cases[0].q, build_case(SPECS[1], 0).q)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_correct_backend_keeps_every_relation(backend):
    loaded = get_backends(["torch"])[0] if backend == "torch" else as_loaded(mutants.mutant("correct"))
    for spec in SPECS:
        case = build_case(spec, 3)
        assert metamorphic.check(loaded, case, tuple(R), RunConfig(), InProcess()) == (), f"{spec.name=}"


def test_a_kernel_whose_bits_move_between_launches_keeps_the_exact_relations_within_rtol():
    """The rotated head sum differs bit for bit on every launch: an exact relation is then judged within rtol."""
    rotated = as_loaded(mutants.mutant("rotated_head_sum"))
    case = build_case(SPECS[0], 3)
    assert metamorphic.check(rotated, case, tuple(R), RunConfig(), InProcess()) == ()


# Each relation against a planted bug the oracle also catches: (relation, planted backend, the case's spec).
PLANTED = [
    (R.PERMUTE_PAGES, planted.pages_in_id_order, CaseSpec(name="p", batch=3, next_n=2, max_model_len=96)),
    (R.REORDER_REQUESTS, planted.first_request_cap, CaseSpec(name="r", lengths=(20, 70, 45), max_model_len=96)),
    (R.PAD_REQUESTS, planted.wrong_after_empty_request, CaseSpec(name="e", lengths=(40, 0, 33, 9), next_n=2)),
    (R.SPLIT_BATCH, planted.wrong_past_batch_limit, CaseSpec(name="s", batch=6, next_n=1, max_model_len=64,
                                                             length_dist=LengthDist.FULL)),
    (R.FLATTEN_NEXT_N, planted.draft_rows_reuse_weights, CaseSpec(name="f", batch=2, next_n=3, max_model_len=64)),
    (R.SCALE_Q, planted.accumulator_at_one, CaseSpec(name="q", batch=2, next_n=1, max_model_len=64)),
    (R.PERMUTE_HEADS, planted.weights_of_next_head, CaseSpec(name="h", batch=2, next_n=1, max_model_len=64)),
    (R.APPEND_KEYS, planted.one_key_past, CaseSpec(name="a", lengths=(17, 30), next_n=1, max_model_len=64)),
]


@pytest.mark.parametrize("relation, bug, spec", PLANTED, ids=[r.value for r, _b, _s in PLANTED])
def test_each_relation_is_caught_failing_by_a_planted_bug_the_oracle_also_catches(relation, bug, spec):
    backend, case = as_loaded(bug), build_case(spec, 1)
    judged = run_one(backend, case, RunConfig())
    assert judged.verdict.failed and not judged.metamorphic, f"the oracle must catch it: {judged.verdict=}"
    related = run_one(backend, case, RunConfig(metamorphic=(relation,)))
    assert [v.relation for v in related.metamorphic] == [relation], f"{related.metamorphic=}"
    assert related.verdict == judged.verdict  # the oracle's verdict stays the headline
    violation = related.metamorphic[0]
    assert violation.related[0].startswith(f"{case.name}~{relation.value}") and violation.rows


def test_a_violation_where_the_oracle_passes_is_fail_metamorphic_and_round_trips():
    """No empty request in the case: the oracle passes; the padded case puts one before every request."""
    backend = as_loaded(planted.wrong_after_empty_request)
    case = build_case(CaseSpec(name="full", batch=3, next_n=2, max_model_len=64, length_dist=LengthDist.FULL), 2)
    result = run_one(backend, case, RunConfig(metamorphic=(R.PAD_REQUESTS, R.PERMUTE_PAGES)))
    assert result.verdict == Verdict.FAIL_METAMORPHIC and result.comparison.verdict == Verdict.PASS
    (violation,) = result.metamorphic
    assert violation.relation == R.PAD_REQUESTS and not violation.exact
    assert violation.related == ("full-s2~pad-requests",)
    assert math.isinf(violation.related_value) and violation.original == violation.expected
    assert CaseResult.from_json(to_jsonable(result), "result.") == result


def test_a_metamorphic_failure_shrinks_with_its_relation_still_violated():
    backend = as_loaded(planted.wrong_after_empty_request)
    case = build_case(CaseSpec(name="full", batch=4, next_n=2, max_model_len=64, length_dist=LengthDist.FULL), 2)
    found = shrink(case, backend, RunConfig(metamorphic=(R.PAD_REQUESTS,)), budget_seconds=60)
    assert found.result.verdict == Verdict.FAIL_METAMORPHIC
    assert found.result.metamorphic[0].relation == R.PAD_REQUESTS
    assert found.case.batch == 1 and found.case.next_n == 1, found.case.describe()
    assert found.result.metamorphic[0].related == (f"{found.case.name}~pad-requests",)


def test_under_tail_unspecified_the_tail_is_not_related():
    """The one-key-past bug writes past each window: a backend that declares its tail unspecified keeps
    append-keys (only windows are compared there)."""
    lax = dataclasses.replace(as_loaded(planted.one_key_past).backend,
                              contract=dataclasses.replace(planted.CONTRACT, mask=MaskConvention.TAIL_UNSPECIFIED))
    case = build_case(PLANTED[-1][2], 1)
    assert metamorphic.check(as_loaded(lax), case, (R.APPEND_KEYS,), RunConfig(), InProcess()) == ()
