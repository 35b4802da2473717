"""Planning: shards, filters, the names cases get, and which earlier results a resumed run keeps."""

from __future__ import annotations

import dataclasses

import pytest

from difftest.backends.torch_ref import TorchBackend
from difftest.core.case import Case
from difftest.core.contract import WorkPartition
from difftest.core.errors import SpecError
from difftest.core.kinds import CaseKind, PartitionScope
from difftest.engine.plan import PlannedCase, Shard, SuiteRequest, envelope_plan, filtered, plan
from difftest.generators.envelope import Target
from difftest.generators.spec import CaseSpec


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


# --------------------------------------------------------------------------- envelope plans

def _reader(name: str, **envelope: object) -> object:
    """The per-sequence test kernel under a contract with `envelope` (a backend of its own name)."""
    from difftest.backends.user import FunctionBackend
    from tests.user_backends import PER_SEQUENCE, per_sequence_reader

    return FunctionBackend(name, dataclasses.replace(PER_SEQUENCE, **envelope), per_sequence_reader)


def test_a_backend_declaring_h64_block64_only_runs_only_such_cases() -> None:
    narrow = _reader("narrow", heads=(64,), block_sizes=(64,))
    planned = envelope_plan([TorchBackend(), narrow], Target.small_cpu(), seed=0)
    mine = [c for c in planned.cases if "narrow" in c.backends]
    assert mine and all((c.spec.heads, c.spec.block_size) == (64, 64) for c in mine), [c.name for c in mine]
    assert all("torch" in c.backends for c in planned.cases), "the oracle-as-backend takes every case"
    assert any((c.spec.heads, c.spec.block_size) != (64, 64) for c in planned.cases), "torch's own envelope too"


def test_backends_with_one_envelope_share_every_case() -> None:
    one, two = _reader("one"), _reader("two")
    planned = envelope_plan([one, two], Target.small_cpu(), seed=0)
    assert planned.cases and all(c.backends == {"one", "two"} for c in planned.cases)
    specs = [c.spec for c in planned.cases]
    assert len(specs) == len(set(specs)), "one case per distinct spec: the oracle runs once per case"
    assert len({c.name for c in planned.cases}) == len(planned.cases), "names are unique"


def test_a_backend_unavailable_here_runs_nothing_and_says_why() -> None:
    planned = envelope_plan([TorchBackend(), _reader("gpu-only", devices=("cuda",))], Target.small_cpu(), seed=0)
    assert planned.idle["gpu-only"] == "gpu-only declares devices ['cuda'], not cpu", planned.idle
    assert all("gpu-only" not in c.backends for c in planned.cases)


def test_a_different_split_size_gives_different_edge_lengths() -> None:
    def tile_lengths(unit: int) -> set[int]:
        partition = WorkPartition(unit, PartitionScope.GLOBAL, workers=4)
        backend = _reader(f"split-{unit}", partition=partition, tiles=(unit,))
        cases = envelope_plan([backend], Target.small_cpu(), seed=0).cases
        return {n for c in cases if "partition-straddle" in c.families or "tile-multiples" in c.families
                for n in (c.spec.lengths or ())}
    assert tile_lengths(32) != tile_lengths(48)
    assert {31, 32, 33} <= tile_lengths(32) and {47, 48, 49} <= tile_lengths(48)


def test_a_backend_reaches_only_the_families_its_own_plan_claims_of_a_shared_case(tmp_path) -> None:
    """torch's max-context cases are 1024 tokens on the CPU; a backend declaring max_context 300 runs its
    own at 300, which torch runs too without it being torch's longest context."""
    short = _reader("short", max_context=300)
    planned = envelope_plan([TorchBackend(), short], Target.small_cpu(), seed=0)
    full = {c.spec.max_model_len: c for c in planned.cases if c.spec.name.startswith("max-model-len")}
    assert set(full) == {300, 1024} and full[1024].backends == {"torch"}, full
    ours = dict(full[300].reach)
    assert full[300].backends == {"torch", "short"} and ours == {"torch": (), "short": ("max-context",)}, ours
    case = full[300].build("cpu")
    assert case.meta["reach"] == {"torch": [], "short": ["max-context"]} and case.meta["families"] == ["max-context"]
    case.save(tmp_path / "case.npz")
    assert Case.load(tmp_path / "case.npz").meta["reach"] == case.meta["reach"], "a bundle's case keeps it"
