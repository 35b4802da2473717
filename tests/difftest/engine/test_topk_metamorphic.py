"""Top-k metamorphic relations: every related case's truth follows from the case's; correct kernels keep every
relation under each padding convention; each relation is caught failing by a planted bug (a catalogue mutant)
that the oracle comparison also catches, and through the operation runner (RunConfig.metamorphic) by one the
oracle passes, FAIL(metamorphic); a related case the backend dies on is a violation; a violated relation
shrinks."""

from __future__ import annotations

import pytest
import torch

from difftest.backends import mutants
from difftest.backends.torch_topk import TorchTopk, VllmTorchTopk
from difftest.core.errors import SpecError
from difftest.core.kinds import Isolation, MetamorphicRelation, OperationKind, TopkRelation
from difftest.core.schema import to_jsonable
from difftest.core.topk import TopkCase, encode_topk
from difftest.core.verdict import Verdict
from difftest.engine import topk_metamorphic
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, run_one, run_operation
from difftest.engine.result import CaseResult
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Target
from difftest.generators.topk import TopkPlanned, TopkSpec, TopkValues, WindowDist, build_topk_case, topk_plan
from difftest.generators.topk_shrink import shrink_topk
from difftest.operations import operation
from difftest.oracles.topk import reference
from tests.broken_topk import NarrowBuffer

R = TopkRelation
TOPK = operation(OperationKind.TOPK)
PLAN = [p.spec for p in topk_plan(TorchTopk.contract, Target.small_cpu()) if isinstance(p, TopkPlanned)]


@pytest.mark.parametrize("relation", list(R), ids=lambda r: r.value)
def test_the_truth_of_every_related_case_follows_from_the_case(relation):
    for spec in PLAN:
        case = build_topk_case(spec, 1)
        change = topk_metamorphic.related(case, relation)
        truth, related = reference(case), reference(change.case)
        assert torch.equal(related.window, truth.window + change.gained), spec.name
        for field in ("candidates", "nans", "kth", "above", "equal"):
            assert torch.equal(getattr(related, field), getattr(truth, field)), (spec.name, field)


@pytest.mark.parametrize("backend", [TorchTopk(), VllmTorchTopk(), mutants.topk_mutant("topk_random_ties")],
                         ids=lambda b: b.name)
def test_a_correct_kernel_keeps_every_relation(backend):
    for spec in PLAN:
        case = build_topk_case(spec, 2)
        if backend.contract.accepts(case, "cpu") is None:
            assert topk_metamorphic.check(backend, case, tuple(R)) == (), spec.name


# Each relation against a catalogue mutant the oracle also catches, on a case that shows both.
PLANTED = [
    # windows of 10 and 12 columns holding 5 candidates at k 16: -inf positions returned, 6 and 4 pads where
    # 11 belong; 16 more -inf columns and the mutant pads nothing
    (R.ADD_NEG_INF, "topk_padded_past_window", Verdict.FAIL_PADDING,
     TopkSpec(name="short", rows=2, width=64, k=16, starts=(0, 0), ends=(10, 12), finite=(5,))),
    # 8 values above 8000 ties at k 16: the capped buffer loses the above values past its 2048th candidate in
    # column order, which a shuffle changes
    (R.PERMUTE_COLUMNS, "topk_candidate_buffer", Verdict.FAIL_MISSING,
     TopkSpec(name="ties", rows=1, width=9000, k=16, windows=WindowDist.FULL, values=TopkValues.TIED, ties=(8000,))),
]


@pytest.mark.parametrize("relation, key, verdict, spec", PLANTED, ids=[r.value for r, *_ in PLANTED])
def test_each_relation_is_caught_failing_by_a_planted_bug_the_oracle_also_catches(relation, key, verdict, spec):
    kernel, case = mutants.topk_mutant(key), build_topk_case(spec, 0)
    judged = compare_topk(reference(case), kernel(encode_topk(case, kernel.contract), None), case, kernel.contract)
    assert judged.verdict == verdict, judged.headline()
    (violation,) = topk_metamorphic.check(kernel, case, tuple(R))
    assert violation.relation == relation and violation.related == f"{case.name}~{relation.value}"
    assert violation.rows and violation.describe().startswith(f"{relation.value} does not hold on ")


def test_a_violation_shrinks_with_its_relation_still_violated():
    relation, key, _verdict, spec = PLANTED[0]
    kernel = mutants.topk_mutant(key)
    case = build_topk_case(spec.replace(rows=6, width=40, k=32, starts=None, ends=None, windows=WindowDist.PREFIX), 3)

    def violated(candidate) -> bool:
        return bool(topk_metamorphic.check(kernel, candidate, (relation,)))

    found = shrink_topk(case, violated, kernel.contract, budget_seconds=20)
    assert violated(found.case) and found.case.rows == 1 and found.case.width < case.width, found.case.describe()


def _front_loaded() -> TopkCase:
    """One row of 9000 columns at k 16: 100 in its first 8 columns, 1 (ties with the k-th) everywhere else."""
    logits = torch.ones(1, 9000)
    logits[0, :8] = 100.0
    return TopkCase("front-loaded", logits, 9000, torch.zeros(1, dtype=torch.int64), torch.full((1,), 9000), 16)


# Each relation against a catalogue mutant on a case the oracle passes it on, through the operation runner.
PASSED_BY_THE_ORACLE = [
    # windows shorter than k with no -inf in them: -1 past the window is -1 past the candidates; 16 -inf columns
    # more and the mutant returns them
    (R.ADD_NEG_INF, "topk_padded_past_window",
     lambda: build_topk_case(TopkSpec(name="short", rows=2, width=64, k=16, starts=(0, 0), ends=(10, 12)), 0)),
    # the capped buffer holds the 8 values above the k-th (the first 2048 candidates in column order); shuffled,
    # most of them lie past its 2048th candidate
    (R.PERMUTE_COLUMNS, "topk_candidate_buffer", _front_loaded),
]


@pytest.mark.parametrize("relation, key, make", PASSED_BY_THE_ORACLE, ids=[r.value for r, *_ in PASSED_BY_THE_ORACLE])
def test_a_relation_the_run_checks_makes_a_result_the_oracle_passes_fail_metamorphic(relation, key, make):
    kernel, case = mutants.topk_mutant(key), make()
    named = Named(kernel.name, kernel)
    others = tuple(r for r in R if r != relation)
    assert run_one(TOPK, named, case, RunConfig(metamorphic=others)).verdict == Verdict.PASS
    result = run_one(TOPK, named, case, RunConfig(metamorphic=tuple(R)))
    assert result.verdict == Verdict.FAIL_METAMORPHIC and result.selection.wrong_rows == ()
    (violation,) = result.metamorphic
    assert violation.relation == relation and violation.related == f"{case.name}~{relation.value}"
    assert violation.rows and (violation.chosen, violation.related_pads) != (violation.related_chosen,
                                                                              violation.expected_pads)
    assert violation.describe().startswith(f"{relation.value} does not hold on ")
    # The pair again, from the case and the relation's name alone: the same violation.
    assert topk_metamorphic.check(kernel, case, (TopkRelation(relation.value),)) == (violation,)
    assert CaseResult.from_json(to_jsonable(result), "result.") == result


def test_torch_topk_keeps_every_relation_through_the_run():
    for spec in TOPK.suite():
        result = run_one(TOPK, Named("torch-topk", TorchTopk()), TOPK.build(spec, 1, "cpu"),
                         RunConfig(metamorphic=tuple(R)))
        assert (result.verdict, result.metamorphic) == (Verdict.PASS, ()), spec.name


def test_a_related_case_that_kills_the_worker_is_a_violation_and_the_run_goes_on():
    """add-neg-inf widens the row past the buffer: the worker dies on the related case, not on the case, and the
    next case gets a fresh one."""
    case = build_topk_case(TopkSpec(name="narrow", rows=2, width=64, k=16, windows=WindowDist.PREFIX), 0)
    backends = [Named(NarrowBuffer.name, NarrowBuffer()), Named("torch-topk", TorchTopk())]
    results = run_operation(TOPK, backends, [Drawn(case), Drawn(case)], RunConfig(isolate=True, metamorphic=tuple(R)))
    assert [r.verdict for r in results] == [Verdict.FAIL_METAMORPHIC, Verdict.PASS] * 2
    assert {r.isolation for r in results} == {Isolation.WORKER}
    (violation,) = results[0].metamorphic
    assert violation.relation == R.ADD_NEG_INF and violation.rows == ()
    assert violation.note.startswith("CRASH on the related case: ") and "SIGABRT" in violation.note
    assert violation.describe().startswith(f"add-neg-inf on {case.name}~add-neg-inf: CRASH")


def test_relations_of_another_operation_are_refused_naming_the_field():
    case = build_topk_case(PLAN[0], 0)
    with pytest.raises(SpecError, match=r"^metamorphic=\('scale-q',\): expected relations of the topk operation"):
        run_one(TOPK, Named("torch-topk", TorchTopk()), case, RunConfig(metamorphic=(MetamorphicRelation.SCALE_Q,)))
    with pytest.raises(SpecError, match=r"^metamorphic=.*: expected a tuple of distinct relations of one operation"):
        RunConfig(metamorphic=(MetamorphicRelation.SCALE_Q, R.ADD_NEG_INF))
