"""difftest.generators.strategies: what specs() and cases() draw, which way they shrink, how they reject arguments."""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from difftest.core.kinds import Fp8Flavour
from difftest.generators import CaseSpec, Stale, Values, build_case
from difftest.generators.profiles import CI_PROFILE, DEV_PROFILE, NIGHTLY_PROFILE, register_profiles
from difftest.generators.strategies import cases, specs

CI = settings(max_examples=30, deadline=None, derandomize=True, database=None)
FIND = settings(max_examples=200, deadline=None, derandomize=True, database=None)


@CI
@given(specs(max_batch=3, max_next_n=2, heads=(2, 4), head_dims=(16,), block_sizes=(4, 8), max_model_len=40,
             max_padding=1, max_extra_columns=0, values=(Values.NORMAL,), fp8=(Fp8Flavour.E4M3FNUZ,)))
def test_specs_stay_within_their_bounds(spec: CaseSpec) -> None:
    assert spec.lengths is not None and 1 <= len(spec.lengths) <= 3 and spec.batch == len(spec.lengths)
    assert all(0 <= n <= 40 for n in spec.lengths), spec.lengths
    assert 1 <= spec.next_n <= 2 and spec.heads in (2, 4) and spec.head_dim == 16
    assert spec.block_size in (4, 8) and spec.max_model_len == 40 and spec.padding <= 1
    assert spec.extra_columns == 0 and spec.values == Values.NORMAL and spec.fp8 == Fp8Flavour.E4M3FNUZ


@CI
@given(cases(max_batch=2, max_model_len=48, heads=(1, 4), head_dims=(16, 32)))
def test_cases_are_what_their_recorded_spec_and_seed_build(case) -> None:
    spec = CaseSpec.from_json(case.meta["spec"])
    expected_lens = [*spec.lengths, *[0] * spec.padding]
    assert case.seq_lens.tolist() == expected_lens
    again = build_case(spec, case.meta["seed"])
    assert torch.equal(again.q, case.q) and torch.equal(again.block_table, case.block_table)


def test_specs_shrink_to_the_simplest_spec() -> None:
    spec = find(specs(), lambda s: True, settings=FIND)
    simplest = dict(lengths=(0,), next_n=1, block_size=16, heads=1, head_dim=16, padding=0, shared_blocks=False,
                    stale=Stale.CANARY, extra_columns=0, values=Values.INTEGER, fp8=Fp8Flavour.E4M3FN)
    assert {k: getattr(spec, k) for k in simplest} == simplest


@pytest.mark.parametrize(("condition", "field", "minimal"), [
    (lambda s: max(s.lengths) >= 33, "lengths", (33,)),
    (lambda s: len(s.lengths) >= 3, "lengths", (0, 0, 0)),
    (lambda s: s.next_n >= 3, "next_n", 3),
    (lambda s: s.heads > 4, "heads", 32),
    (lambda s: s.padding >= 1, "padding", 1),
], ids=["shorter-lengths", "fewer-sequences", "smaller-next-n", "first-listed-heads", "less-padding"])
def test_specs_shrink_each_dimension_toward_its_floor(condition, field: str, minimal: object) -> None:
    spec = find(specs(), condition, settings=FIND)
    assert getattr(spec, field) == minimal, spec


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(max_batch=0), r"max_batch=0 \(type=int\) must be an int >= 1"),
    (dict(max_next_n=2.0), r"max_next_n=2.0 \(type=float\)"),
    (dict(max_padding=-1), r"max_padding=-1"),
    (dict(heads=()), r"heads=\(\) .* non-empty"),
    (dict(head_dims=(16, 24)), r"head_dims=\(16, 24\): 24 .* multiple of 16"),
    (dict(block_sizes=(0,)), r"block_sizes=\(0,\): 0"),
    (dict(values=("normal",)), r"values=.*'normal' \(type=str\)"),
    (dict(max_model_len=True), r"max_model_len=True \(type=bool\)"),
])
def test_bad_arguments_are_named_with_their_value(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        specs(**kwargs)


def test_cases_rejects_a_device_that_is_not_a_string() -> None:
    with pytest.raises(InvalidArgument, match="device=0"):
        cases(device=0)  # type: ignore[arg-type]


def test_registered_profiles_have_no_deadline_and_ci_is_repeatable() -> None:
    register_profiles()
    profiles = {name: settings.get_profile(name) for name in (CI_PROFILE, NIGHTLY_PROFILE, DEV_PROFILE)}
    assert all(p.deadline is None for p in profiles.values())
    assert profiles[CI_PROFILE].derandomize and profiles[CI_PROFILE].database is None
    assert profiles[NIGHTLY_PROFILE].max_examples > profiles[CI_PROFILE].max_examples
