"""Planning: shards, filters, the names cases get, and which earlier results a resumed run keeps."""

from __future__ import annotations

import pytest

from difftest.errors import SpecError
from difftest.kinds import CaseKind
from difftest.plan import PlannedCase, Shard, SuiteRequest, filtered, plan
from generators.spec import CaseSpec


@pytest.mark.parametrize(("text", "shard"), [("0/1", (0, 1)), ("1/2", (1, 2)), ("3/8", (3, 8))])
def test_parse_shard(text: str, shard: tuple[int, int]) -> None:
    assert (Shard.parse(text).index, Shard.parse(text).count) == shard and str(Shard.parse(text)) == text


@pytest.mark.parametrize("text", ["2/2", "-1/2", "0/0", "1", "a/b", "1/2/3", ""])
def test_bad_shard_is_a_spec_error_naming_the_parameter(text: str) -> None:
    with pytest.raises(SpecError) as info:
        Shard.parse(text)
    assert info.value.field == "shard", f"{info.value=}"


@pytest.mark.parametrize("count", [1, 2, 3, 5, 11, 12])
def test_shards_partition_the_plan_in_order(count: int) -> None:
    items = [f"case-{i}" for i in range(11)]
    shards = [Shard(i, count).of(items) for i in range(count)]
    assert sorted(item for shard in shards for item in shard) == sorted(items), f"{shards=}"  # union, nothing twice
    assert all(shard == sorted(shard, key=items.index) for shard in shards), f"{shards=}"
    assert all(items.index(item) % count == i for i, shard in enumerate(shards) for item in shard), f"{shards=}"


def test_a_planned_case_is_named_by_its_spec_and_seed() -> None:
    assert PlannedCase(CaseSpec(name="edge"), 3000).name == "edge-s3000"


def test_a_spec_plans_count_seeds_from_the_seed() -> None:
    cases = plan(SuiteRequest(spec=CaseSpec(name="one"), seed=5, count=3))
    assert [c.name for c in cases] == ["one-s5", "one-s6", "one-s7"]


def test_filters_keep_matching_cases_and_refuse_a_pattern_that_matches_none() -> None:
    cases = plan(SuiteRequest(cases=CaseKind.EDGES))
    kept = [c.name for c in filtered(cases, ["length-one-*"])]
    assert kept == [c.name for c in cases if c.name.startswith("length-one-")] and kept, f"{kept=}"
    with pytest.raises(SpecError) as info:
        filtered(cases, ["no-such-case-*"])
    assert info.value.field == "case_filter"


@pytest.mark.parametrize(("changes", "field"), [(dict(count=-1), "count"), (dict(count=10**9), "count"),
                                                (dict(seed=2**63), "seed")])
def test_bounds_name_the_parameter(changes: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        SuiteRequest(**changes)
    assert info.value.field == field
