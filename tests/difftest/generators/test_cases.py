"""The curated edge list and the named suites."""

from __future__ import annotations

import pytest

from difftest.core.errors import SpecError
from difftest.generators import build_case
from difftest.generators.cases import SUITES, default_specs, edge_cases, suite


@pytest.mark.parametrize("spec", edge_cases(), ids=lambda s: s.name)
def test_every_edge_spec_builds_and_validates(spec):
    for seed in (0, 1):
        case = build_case(spec.validate(), seed)
        assert case.validate() is case
        assert case.name == f"{spec.name}-s{seed}" and case.batch == spec.total_batch, f"{case.describe()}"
        assert case.next_n == spec.next_n and case.max_model_len == spec.max_model_len


def test_edge_names_are_unique_and_cover_the_bug_classes():
    names = [s.name for s in edge_cases()]
    assert len(names) == len(set(names)) == 14, f"{names=}"
    specs = {s.name: s for s in edge_cases()}
    assert set(build_case(specs["all-padding"], 0).seq_lens.tolist()) == {0}
    assert build_case(specs["max-model-len"], 0).seq_lens.tolist() == [128, 128]
    short = build_case(specs["shorter-than-next-n"], 0)
    assert any(0 < n < short.next_n for n in short.seq_lens.tolist()), f"{short.seq_lens=}"
    edges = build_case(specs["block-boundaries"], 0).seq_lens.tolist()
    assert {15, 16, 17, 31, 32, 33} == set(edges), f"{edges=}"
    assert (specs["deepseek-heads"].heads, specs["deepseek-heads"].head_dim) == (64, 128)


def test_default_specs_one_per_next_n():
    assert [s.next_n for s in default_specs()] == [1, 2, 3, 4]
    assert [s.name for s in default_specs()] == ["random-mtp1-uniform", "random-mtp2-edges",
                                                  "random-mtp3-uniform", "random-mtp4-edges"]


def test_suite_sizes_and_names():
    assert SUITES == ("random", "edges", "all")
    assert len(suite("random", count=3)) == 4 * 3
    assert len(suite("edges")) == 14
    everything = suite("all", count=6)
    assert len(everything) == 4 * 6 + 14, f"{len(everything)=}"
    assert [s.name for s, _ in everything[:6]] == ["random-mtp1-uniform"] * 6
    assert [s.name for s, _ in everything[24:]] == [s.name for s in edge_cases()]
    seeds = [seed for _, seed in everything]
    assert len(set(seeds)) == len(seeds), "every (spec, seed) draws different lengths"
    assert suite("all", count=2, seed=5)[0][1] == 5


def test_suite_varies_next_n_and_block_size():
    pairs = suite("random", count=1, next_n=(1, 2), block_sizes=(1, 64))
    names = [s.name for s, _ in pairs]
    # next_n 1 and 2 turn random-mtp3-uniform into copies of random-mtp1/2-uniform (dropped):
    # {uniform, edges} x {mtp1, mtp2} x {bs1, bs64}.
    assert len(names) == len(set(names)) == 2 * 2 * 2, f"{names=}"
    assert "random-mtp2-uniform-bs64" in names and "random-mtp1-edges-bs1" in names, f"{names=}"
    for spec, _ in pairs:
        assert f"-mtp{spec.next_n}-" in spec.name and spec.name.endswith(f"-bs{spec.block_size}"), f"{spec.name=}"
    edges = suite("edges", next_n=(2, 2))
    assert len(edges) == 14 and all(s.next_n == 2 for s, _ in edges), "duplicate values are dropped"


def test_suite_overrides():
    """heads and head_dim change every spec; other fields only the random ones (edges keep lengths and tables)."""
    pairs = suite("all", count=1, heads=4, head_dim=16, max_model_len=48, batch=2)
    randoms, edges = pairs[:4], pairs[4:]
    assert all((s.heads, s.head_dim, s.max_model_len, s.batch) == (4, 16, 48, 2) for s, _ in randoms), f"{randoms=}"
    assert [s for s, _ in edges] == [s.replace(heads=4, head_dim=16) for s in edge_cases()], f"{edges=}"


def test_unknown_suite_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        suite("most")
    assert (info.value.field, info.value.value) == ("cases", "most") and "'edges'" in info.value.expected
