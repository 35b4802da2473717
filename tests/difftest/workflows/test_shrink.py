"""difftest.workflows.shrink, and hypothesis finding the same planted bugs: both must reach the bug's boundary."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings

from difftest.backends import as_loaded
from difftest.backends.user import FunctionBackend
from difftest.core.errors import SpecError
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_one
from difftest.generators import CaseSpec, Stale, Values, build_case
from difftest.generators.strategies import cases
from difftest.oracles.paged_mqa_logits import reference
from difftest.records.bundle import load_bundle, write_bundle
from difftest.workflows.shrink import Failure, case_from_line, compact_pool, select_sequences, shrink
from tests import broken_backends, planted

BOUNDARY = as_loaded(planted.block_boundary_off_by_one)
DRAFT_WEIGHTS = as_loaded(planted.draft_rows_reuse_weights)
BLOCK = 16
# A batch a random run would produce: several sequences, MTP, padding, shared and stale table entries.
LARGE = CaseSpec(name="large", lengths=(37, 100, 5, 64, 90, 128, 3), next_n=3, padding=2, shared_blocks=True,
                 extra_columns=1, values=Values.HEAVY, stale=Stale.OTHER, heads=32, head_dim=64, block_size=BLOCK)


@pytest.fixture(scope="module")
def large_case():
    case = build_case(LARGE, seed=7)
    assert run_one(BOUNDARY, case, RunConfig()).verdict == Verdict.FAIL_MASK
    return case


def test_select_sequences_keeps_each_sequences_rows(large_case) -> None:
    keep = [5, 0, 7]
    subset = select_sequences(large_case, keep).validate()
    rows = torch.tensor([b * LARGE.next_n + j for b in keep for j in range(LARGE.next_n)])
    assert subset.seq_lens.tolist() == [large_case.seq_lens[b].item() for b in keep]
    assert torch.equal(reference(subset), reference(large_case)[rows])


def test_compact_pool_keeps_only_referenced_blocks_and_the_logits(large_case) -> None:
    one = select_sequences(large_case, [1])
    compact = compact_pool(one).validate()
    assert compact.k_pool.shape[0] == torch.unique(one.block_table).numel() < large_case.k_pool.shape[0]
    assert torch.equal(reference(compact), reference(one))


def test_shrinking_a_failing_bundle_reaches_one_sequence_at_the_block_boundary(large_case, tmp_path) -> None:
    result = run_one(BOUNDARY, large_case, RunConfig())
    bundle = load_bundle(write_bundle(tmp_path, large_case, result, RunConfig(), BOUNDARY.origin))
    found = shrink(bundle, BOUNDARY, budget_seconds=30.0)
    assert found.finished and found.result.verdict == Verdict.FAIL_MASK
    assert (found.spec.lengths, found.spec.padding, found.spec.next_n) == ((BLOCK,), 0, 1), found.line()
    again = case_from_line(found.line())
    assert run_one(BOUNDARY, again, RunConfig()).verdict == Verdict.FAIL_MASK


def test_a_case_without_spec_is_shrunk_by_slicing_its_tensors(large_case) -> None:
    bare = dataclasses.replace(large_case, meta={})
    found = shrink(bare, BOUNDARY)
    assert found.spec is None and found.finished
    assert (found.case.batch, found.case.seq_lens.tolist(), found.case.next_n) == (1, [BLOCK], 1), found.line()
    assert found.result.verdict == Verdict.FAIL_MASK


def test_a_value_bug_keeps_its_verdict_and_the_draft_rows_it_needs(large_case) -> None:
    found = shrink(large_case, DRAFT_WEIGHTS)
    assert found.result.verdict == Verdict.FAIL_VALUE
    assert (found.case.batch, found.case.next_n) == (1, 2), found.line()


def test_an_error_keeps_its_exception_type() -> None:
    def rejects_mtp(q, kv_cache, weights, context_lens, block_table, max_model_len):
        if q.shape[1] > 2:
            raise NotImplementedError("next_n > 2")
        return planted.block_boundary_off_by_one(q, kv_cache, weights, context_lens, block_table, max_model_len)

    backend = FunctionBackend("rejects-mtp", planted.CONTRACT, rejects_mtp)
    found = shrink(build_case(LARGE.replace(lengths=(5, 7), padding=0), 0), backend)
    assert Failure.of(found.result) == Failure(Verdict.ERROR, "NotImplementedError")
    assert found.case.next_n == 3 and found.case.batch == 1


def test_a_passing_case_is_refused(large_case) -> None:
    with pytest.raises(SpecError, match="fails on"):
        shrink(select_sequences(large_case, [2]), BOUNDARY)


def test_no_budget_returns_the_original_after_one_probe(large_case) -> None:
    found = shrink(large_case, BOUNDARY, budget_seconds=0.0)
    assert not found.finished and found.probes == 1
    assert found.case.seq_lens.tolist() == large_case.seq_lens.tolist()


def test_hypothesis_finds_the_planted_mask_bug_and_shrinks_it_to_the_boundary(large_case) -> None:
    failing = []

    @settings(max_examples=100, deadline=None, derandomize=True, database=None)
    @given(cases(block_sizes=(BLOCK,), heads=(1, 4), head_dims=(16, 32), max_model_len=64))
    def backend_agrees_with_oracle(case) -> None:
        result = run_one(BOUNDARY, case, RunConfig())
        if result.verdict.failed:
            failing.append(case)
        assert not result.verdict.failed, result.verdict

    with pytest.raises(AssertionError, match="FAIL"):
        backend_agrees_with_oracle()
    minimal = CaseSpec.from_json(failing[-1].meta["spec"])  # hypothesis replays the shrunk example last
    assert (minimal.lengths, minimal.padding, minimal.next_n) == ((BLOCK,), 0, 1), minimal
    assert (minimal.heads, minimal.head_dim, minimal.values, failing[-1].meta["seed"]) == (1, 16, Values.INTEGER, 0)
    shrunk = shrink(large_case, BOUNDARY).spec
    assert (shrunk.lengths, shrunk.padding, shrunk.next_n) == (minimal.lengths, minimal.padding, minimal.next_n)


def test_an_isolated_shrink_probes_in_a_worker_and_reduces_a_crash_to_its_boundary() -> None:
    # Each probe that crashes takes down only the worker; the next probe starts another.
    crashes = as_loaded(broken_backends.segfaults_past_64)
    case = build_case(LARGE.replace(lengths=(37, 100, 5, 90), next_n=1, padding=0), 3)
    found = shrink(case, crashes, RunConfig(isolate=True), budget_seconds=240.0)
    assert found.finished and found.result.verdict == Verdict.CRASH, found.result.reason
    assert (found.case.batch, found.case.seq_lens.tolist()) == (1, [65]), found.line()
