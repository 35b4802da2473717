"""difftest.generators.strategies: what specs() and cases() draw, which way they shrink, how they reject arguments,
and that a strategy built from a contract draws only cases the contract takes (every built-in backend's)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample

from difftest.backends.registry import builtin_backends
from difftest.backends.stages import ragged_backends, topk_backends
from difftest.core.contract import Contract
from difftest.core.kinds import (
    CacheLayout,
    Fp8Flavour,
    IndexConvention,
    LengthEncoding,
    MaskConvention,
    RowStride,
    TopkPadding,
    WindowForm,
)
from difftest.core.topk import TopkContract
from difftest.generators import CaseSpec, Stale, Values, build_case
from difftest.generators.profiles import CI_PROFILE, DEV_PROFILE, NIGHTLY_PROFILE, register_profiles
from difftest.generators.strategies import cases, for_contract, specs, topk_specs

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


register_profiles()
CI_RUN = settings(settings.get_profile(CI_PROFILE), max_examples=15)  # 15 of difftest-ci's 30: 37 contracts
MTP_124 = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                   mask=MaskConvention.TAIL_NEG_INF, next_n=(1, 2, 4))


def on_cpu(contract: Any) -> Any:
    """The contract with the CPU among its devices and no arch named: the envelope is what is drawn from."""
    return dataclasses.replace(contract, devices=("cpu",), archs=None)


def every_builtin_contract() -> list[Any]:
    tables = {**builtin_backends(), **topk_backends(), **ragged_backends()}
    return [pytest.param(on_cpu(make().contract), id=name) for name, make in tables.items()]


HANDMADE = [
    pytest.param(MTP_124, id="paged-mtp-1-2-4"),
    pytest.param(dataclasses.replace(MTP_124, length_encoding=LengthEncoding.FLATTENED, max_batch=6, heads=(8, 16),
                                     heads_power_of_two=True, head_dims=(32,), block_sizes=(64,), max_context=80,
                                     max_pool_bytes=64 * 36 * 4, fp8=Fp8Flavour.E4M3FNUZ), id="paged-tight"),
    pytest.param(TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_CANDIDATES,
                              window=WindowForm.DECODE_RULE, next_n=(2, 3), ks=(4, 16), width_at_least_k=True,
                              row_stride=RowStride.MULTIPLE_OF_4, max_rows=6), id="topk-decode-rule"),
    pytest.param(TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_CANDIDATES,
                              window=WindowForm.LENGTHS, max_k=8, max_width=40, row_stride=RowStride.EQUALS_WIDTH),
                 id="topk-lengths"),
]


@pytest.mark.parametrize("contract", every_builtin_contract() + HANDMADE)
@CI_RUN
@given(data=st.data())
def test_every_drawn_case_is_one_the_contract_takes(contract: Any, data: st.DataObject) -> None:
    case = data.draw(for_contract(contract))
    assert contract.accepts(case, "cpu") is None, case


@CI_RUN
@given(specs(contract=MTP_124, max_next_n=4))
def test_a_next_n_1_2_4_kernel_never_draws_next_n_3(spec: CaseSpec) -> None:
    assert spec.next_n in (1, 2, 4)


def test_the_contract_values_are_all_reachable() -> None:
    assert find(specs(contract=MTP_124), lambda s: s.next_n == 4, settings=FIND).next_n == 4
    with pytest.raises(NoSuchExample):
        find(specs(contract=MTP_124), lambda s: s.next_n == 3, settings=FIND)


def test_the_contract_lists_replace_the_defaults_and_filter_the_given_choices() -> None:
    tight = HANDMADE[1].values[0]
    spec = find(specs(contract=tight), lambda s: True, settings=FIND)
    assert (spec.heads, spec.head_dim, spec.block_size, spec.fp8) == (8, 32, 64, Fp8Flavour.E4M3FNUZ)
    assert spec.max_model_len == 80
    assert find(specs(contract=MTP_124, heads=(3, 4, 8)), lambda s: True, settings=FIND).heads == 3


@pytest.mark.parametrize(("build", "message"), [
    (lambda: specs(contract=dataclasses.replace(MTP_124, devices=("cpu",)), device="cuda"),
     r"device=.cuda.: the contract declares"),
    (lambda: specs(contract=dataclasses.replace(MTP_124, heads=(8,)), heads=(4,)), r"heads: the contract takes none"),
    (lambda: specs(contract=dataclasses.replace(MTP_124, next_n=(8,))), r"max_next_n: the contract takes none"),
    (lambda: topk_specs(TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_CANDIDATES,
                                     window=WindowForm.STARTS_ENDS, dtypes=(torch.bfloat16,))),
     r"contract.dtypes=.*float32"),
], ids=["device", "heads", "next-n", "topk-dtype"])
def test_a_contract_that_leaves_nothing_to_draw_is_named(build: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        build()
