"""TopkSpec (JSON, one-line errors), build_topk_case (seeded, what each distribution draws), the families a
contract's facts give, and the shrinker on each planted bug."""

from __future__ import annotations

import math

import pytest
import torch

from difftest.core.errors import SpecError
from difftest.core.kinds import IndexConvention, RowStride, TopkPadding, WindowForm
from difftest.core.topk import TopkContract, encode_topk
from difftest.core.verdict import Verdict
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Target
from difftest.generators.topk import (
    TopkFamily,
    TopkOmission,
    TopkPlanned,
    TopkSpec,
    TopkValues,
    WindowDist,
    build_topk_case,
    default_topk_specs,
    topk_plan,
)
from difftest.generators.topk_shrink import shrink_topk
from difftest.oracles.topk import reference
from tests.planted_topk import PLANTED
from tests.planted_topk_values import DropsPosInf, SpillsTies

ANY = TopkContract(IndexConvention.ROW_RELATIVE, TopkPadding.PAST_CANDIDATES, WindowForm.STARTS_ENDS)


def test_json_round_trip_and_errors():
    spec = TopkSpec(name="x", rows=6, next_n=2, ties=(1, 2), finite=(3,), starts=(0,) * 6, ends=(5,) * 6,
                    values=TopkValues.TIED)
    assert TopkSpec.from_json(spec.to_json()) == spec
    for data, field in (({"rows": "3"}, "rows"), ({"ties": [1, -2]}, "ties[1]"), ({"colour": 1}, "colour"),
                        ({"width": 4, "row_stride": 3}, "row_stride"), ({"rows": 3, "next_n": 2}, "next_n"),
                        ({"values": "odd"}, "values")):
        with pytest.raises(SpecError) as info:
            TopkSpec.from_json(data)
        assert field in str(info.value), (data, info.value)


def test_same_seed_same_tensors_and_the_seed_matters():
    spec = TopkSpec(rows=3, width=50, k=5, nans=1, pos_infs=1, finite=(30,))
    a, b, c = build_topk_case(spec, 4), build_topk_case(spec, 4), build_topk_case(spec, 5)
    assert torch.equal(a.storage.nan_to_num(), b.storage.nan_to_num()) and torch.equal(a.ends, b.ends)
    assert not torch.equal(a.storage.nan_to_num(), c.storage.nan_to_num())


def test_tied_rows_straddle_the_kth_value():
    k = 16
    case = build_topk_case(TopkSpec(rows=4, width=80, k=k, values=TopkValues.TIED, ties=(k - 1, k, k + 1, 3 * k),
                                    windows=WindowDist.FULL), 0)
    truth = reference(case)
    assert truth.kth.tolist() == [1.0] * 4 and truth.equal.tolist() == [k - 1, k, k + 1, 3 * k], truth
    assert all(above < k <= above + equal for above, equal in zip(truth.above.tolist(), truth.equal.tolist(),
                                                                     strict=True))


def test_special_values_and_outside_and_padding():
    case = build_topk_case(TopkSpec(rows=2, width=20, row_stride=23, k=4, finite=(6,), nans=1, pos_infs=2,
                                    starts=(2, 0), ends=(12, 20)), 0)
    inside = case.logits[0, 2:12]
    assert int(torch.isnan(inside).sum()) == 1 and int(torch.isposinf(inside).sum()) == 2
    assert int(torch.isneginf(inside).sum()) == 4 and (case.logits[0, :2] >= 1e30).all()
    assert (case.storage[:, 20:] == 3.0e38).all()


def test_decode_windows_follow_the_rule():
    case = build_topk_case(TopkSpec(rows=6, next_n=3, width=40, windows=WindowDist.DECODE), 2)
    ends = case.ends.reshape(2, 3)
    assert (case.starts == 0).all() and (ends[:, 1:] - ends[:, :-1] <= 1).all(), ends


def test_default_suite_builds():
    for spec in default_topk_specs(ks=(8,)):
        assert build_topk_case(spec, 0).k == 8


def _names(plan: list) -> dict[str, TopkPlanned | TopkOmission]:
    return {(p.spec.name if isinstance(p, TopkPlanned) else f"omit:{p.family.value}:{p.spec_name}"): p for p in plan}


def test_plan_covers_every_family_and_omits_by_scale():
    plan = topk_plan(ANY, Target.small_cpu())
    reached = {f for p in plan if isinstance(p, TopkPlanned) for f in p.families}
    omitted = {p.family for p in plan if isinstance(p, TopkOmission)}
    assert reached | omitted == set(TopkFamily), set(TopkFamily) - reached - omitted
    assert {TopkFamily.WIDE_ROWS, TopkFamily.ROW_COUNTS} <= omitted and TopkFamily.WIDE_ROWS not in reached
    production = topk_plan(ANY, Target.production_gpu(132, 100 << 30))
    assert any(p.spec.width == 1 << 20 for p in production if isinstance(p, TopkPlanned))
    ks = {p.spec.k for p in plan if isinstance(p, TopkPlanned) and TopkFamily.K_VALUES in p.families}
    assert ks == {512, 1024, 2048}


def test_plan_follows_the_declared_facts():
    lengths_only = TopkContract(IndexConvention.ROW_RELATIVE, TopkPadding.PAST_WINDOW, WindowForm.LENGTHS,
                                ks=(1024,), row_stride=RowStride.MULTIPLE_OF_4, next_n=(1, 2))
    plan = _names(topk_plan(lengths_only, Target.small_cpu()))
    assert "prefill-windows" not in plan and "omit:prefill-windows:prefill-windows" in plan
    assert "omit:odd-stride:odd-width" in plan and "omit:odd-stride:odd-padded-stride" in plan
    assert "padded-stride-256" in plan  # align(width, 256) is a multiple of 4
    assert {p.spec.k for p in plan.values() if isinstance(p, TopkPlanned)} == {1024}


SHRINK_PROBES = 4000  # every planted bug's shrink ends within it (planted-tie-overflow's, the longest, in 1816)


@pytest.mark.parametrize(("backend", "family", "verdict"), PLANTED, ids=[p[0].name for p in PLANTED])
def test_planted_bug_is_caught_on_its_family_and_shrunk(backend, family, verdict):
    plan = _names(topk_plan(backend.contract, Target.small_cpu()))
    case = build_topk_case(plan[family].spec, 0)

    def judged(candidate):
        got = backend(encode_topk(candidate, backend.contract), None)
        return compare_topk(reference(candidate, backend.contract.nan), got, candidate, backend.contract)

    def shows(candidate):  # some row's verdict is the planted one (an absolute index past the width is garbage)
        return verdict in judged(candidate).rows_by_verdict

    result = judged(case)
    if verdict == Verdict.PASS:
        assert result.verdict == judged(case).verdict == Verdict.PASS, result.headline()  # tie choice varies
        return
    assert shows(case), (backend.name, family, result.headline())
    # Bounded by probes, not seconds: the same case on a loaded machine as on an idle one.
    small = shrink_topk(case, shows, backend.contract, budget_seconds=math.inf, max_probes=SHRINK_PROBES)
    assert small.case.rows * small.case.width < case.rows * case.width, (backend.name, small.case)
    assert judged(small.case).verdict == verdict and small.case.name.endswith("-min")
    assert small.case.rows == 1 and small.case.width <= case.width // 2, (backend.name, small.case)


def test_shrink_refuses_a_passing_case():
    case = build_topk_case(TopkSpec(rows=2, width=8, k=2), 0)
    with pytest.raises(SpecError, match="fails"):
        shrink_topk(case, lambda c: False)


def test_shrink_simplifies_values_to_ranks():
    case = build_topk_case(TopkSpec(rows=1, width=16, k=3, windows=WindowDist.FULL), 0)
    small = shrink_topk(case, lambda c: not math.isnan(float(c.logits[0, 0])), budget_seconds=math.inf,
                        max_probes=SHRINK_PROBES)
    assert small.case.width == 1 and float(small.case.logits[0, 0]) == 0.0, small.case


def _planned(name: str) -> TopkSpec:
    return _names(topk_plan(ANY, Target.small_cpu()))[name].spec


def test_extreme_values_hold_float32s_ends_of_both_signs():
    logits = build_topk_case(TopkSpec(rows=4, width=400, k=8, values=TopkValues.EXTREME), 0).logits
    inside = logits[logits > -math.inf]
    denormal = (inside != 0) & (inside.abs() < 2.0 ** -126)
    assert denormal.any() and (inside == torch.finfo(torch.float32).max).any() and (inside == -3.4028235e38).any()
    assert (inside == 0).any() and torch.signbit(inside[inside == 0]).any(), "-0.0 and 0.0 both"


def test_ties_across_rows_tie_every_row_at_its_kth_value_with_a_surplus():
    case = build_topk_case(_planned("ties-across-rows"), 0)
    truth = reference(case)
    assert torch.all(truth.kth_values() == 1.0) and torch.all(truth.above + truth.equal > case.k), truth


def test_padding_rows_come_before_rich_rows_and_after_them():
    first = reference(build_topk_case(_planned("padding-rows-first"), 0)).candidates.tolist()
    last = reference(build_topk_case(_planned("padding-rows-last"), 0)).candidates.tolist()
    k = _planned("padding-rows-first").k
    assert first[:3] == [0, 1, k - 1] and min(first[3:]) > k and last[3:] == first[:3] and min(last[:3]) > k


def test_the_special_values_family_holds_pos_inf_ties_at_the_kth_and_rows_of_all_neg_inf():
    past_k = reference(build_topk_case(_planned("pos-inf-past-k"), 0))
    assert torch.all(past_k.kth_values() == math.inf) and torch.all(past_k.equal == past_k.k + 1)
    assert reference(build_topk_case(_planned("all-neg-inf-rows"), 0)).candidates.tolist()[0::2] == [0, 0]


VALUES_PLANTED = [(DropsPosInf(), "neg-inf-and-pos-inf"), (DropsPosInf(), "pos-inf-past-k"),
                  (SpillsTies(), "ties-across-rows")]


@pytest.mark.parametrize(("backend", "family"), VALUES_PLANTED, ids=[f"{b.name}-{f}" for b, f in VALUES_PLANTED])
def test_the_values_planted_bugs_are_caught_on_their_families(backend, family):
    case = build_topk_case(_names(topk_plan(backend.contract, Target.small_cpu()))[family].spec, 0)
    got = backend(encode_topk(case, backend.contract), None)
    result = compare_topk(reference(case, backend.contract.nan), got, case, backend.contract)
    assert result.verdict.failed, (backend.name, family, result.headline())
