"""Top-k metamorphic relations: every related case's truth follows from the case's; correct kernels keep every
relation under each padding convention; each relation is caught failing by a planted bug (a catalogue mutant)
that the oracle comparison also catches; a violated relation shrinks."""

from __future__ import annotations

import pytest
import torch

from difftest.backends import mutants
from difftest.backends.torch_topk import TorchTopk, VllmTorchTopk
from difftest.core.kinds import TopkRelation
from difftest.core.topk import encode_topk
from difftest.core.verdict import Verdict
from difftest.engine import topk_metamorphic
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Target
from difftest.generators.topk import TopkPlanned, TopkSpec, TopkValues, WindowDist, build_topk_case, topk_plan
from difftest.generators.topk_shrink import shrink_topk
from difftest.oracles.topk import reference

R = TopkRelation
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
    assert violation.rows and violation.describe().startswith(f"{relation.value}: {len(violation.rows)} rows; ")


def test_a_violation_shrinks_with_its_relation_still_violated():
    relation, key, _verdict, spec = PLANTED[0]
    kernel = mutants.topk_mutant(key)
    case = build_topk_case(spec.replace(rows=6, width=40, k=32, starts=None, ends=None, windows=WindowDist.PREFIX), 3)

    def violated(candidate) -> bool:
        return bool(topk_metamorphic.check(kernel, candidate, (relation,)))

    found = shrink_topk(case, violated, kernel.contract, budget_seconds=20)
    assert violated(found.case) and found.case.rows == 1 and found.case.width < case.width, found.case.describe()
