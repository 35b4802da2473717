"""The top-k mutants: the two that must pass are right on every case of the top-k plan (the random tie choice
moving from launch to launch), and each other one is wrong on the family its catalogue entry names, with the
verdict its bug shows."""

from __future__ import annotations

import pytest
import torch

from difftest.backends import mutants
from difftest.core.topk import encode_topk
from difftest.core.verdict import Verdict
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Target
from difftest.generators.topk import TopkPlanned, build_topk_case, topk_plan
from difftest.oracles.topk import reference

PLAN = [p for p in topk_plan(mutants.topk_mutant("topk_correct").contract, Target.small_cpu())
        if isinstance(p, TopkPlanned)]


def _verdict(kernel, case) -> Verdict:
    got = kernel(encode_topk(case, kernel.contract), None)
    return compare_topk(reference(case, kernel.contract.nan), got, case, kernel.contract).verdict


@pytest.mark.parametrize("key", ["topk_correct", "topk_random_ties"])
def test_the_top_k_mutants_that_must_pass_pass_every_planned_case(key):
    kernel = mutants.topk_mutant(key)
    for planned in PLAN:
        assert _verdict(kernel, build_topk_case(planned.spec, 0)) == Verdict.PASS, planned.spec.name


def test_the_random_tie_choice_moves_from_launch_to_launch():
    kernel = mutants.topk_mutant("topk_random_ties")
    (straddle,) = [p.spec for p in PLAN if p.spec.name == "ties-straddle"]
    inputs = encode_topk(build_topk_case(straddle, 0), kernel.contract)
    first, second = kernel(inputs, None), kernel(inputs, None)
    assert not torch.equal(first.sort(dim=1).values, second.sort(dim=1).values)


@pytest.mark.parametrize("key, verdict", [("topk_candidate_buffer", Verdict.FAIL_MISSING),
                                          ("topk_padded_past_window", Verdict.FAIL_PADDING),
                                          ("topk_absolute_indices", Verdict.FAIL_GARBAGE)])
def test_each_top_k_bug_shows_on_its_family(key, verdict):
    spec = mutants.BY_KEY[key]
    family = [p.spec for p in PLAN if spec.caught_by in p.families]
    assert family, spec.caught_by
    verdicts = [_verdict(mutants.topk_mutant(key), build_topk_case(s, 0)) for s in family]
    assert verdict in verdicts, verdicts


def test_the_candidate_buffer_loses_nothing_below_its_size():
    """Rows with at most CANDIDATE_BUFFER values at or above the k-th (every k-values case) are right."""
    kernel = mutants.topk_mutant("topk_candidate_buffer")
    for planned in PLAN:
        if planned.spec.name.startswith("random-k"):
            assert _verdict(kernel, build_topk_case(planned.spec, 0)) == Verdict.PASS
