"""Batching (difftest.engine.batch, runner.run on a Batch): a merged launch gives every case the verdict and
comparison it gets alone, and a failure found in a batch counts only once it fails alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.backends import get_backends
from difftest.core.kinds import OracleKind
from difftest.core.spec import CaseSpec, LengthDist
from difftest.core.verdict import Verdict
from difftest.engine import call, runner
from difftest.engine.batch import Retry, merge
from difftest.engine.comparison import compare
from difftest.engine.config import RunConfig
from difftest.engine.isolate import InProcess
from difftest.engine.runner import run
from difftest.generators.tensors import build_case
from difftest.oracles.reference import make_reference

SHAPE = dict(heads=4, head_dim=16, block_size=4)
PLANTED_BATCH = "tests.planted:wrong_past_batch_limit"
PLANTED_ALWAYS = "tests.planted:batchable_block_boundary"


def _members(next_n: int) -> list:
    """Cases of one shape with different batches and max_model_lens, zero-length requests among them;
    the last one ends with a non-empty request (the batch-dependent planted bug shows there)."""
    specs = [CaseSpec(name="zeros", batch=3, next_n=next_n, max_model_len=16, lengths=(0, 9, 0), **SHAPE),
             CaseSpec(name="drawn", batch=2, next_n=next_n, max_model_len=24, length_dist=LengthDist.EDGES, **SHAPE),
             CaseSpec(name="padded", batch=2, next_n=next_n, max_model_len=12, padding=1, **SHAPE),
             CaseSpec(name="last", batch=2, next_n=next_n, max_model_len=20, lengths=(8, 17), **SHAPE)]
    return [build_case(spec, seed) for seed, spec in enumerate(specs)]


def _summary(results: list) -> list:
    return [(r.backend, r.case, r.verdict, r.rows, r.comparison) for r in results]


@pytest.mark.parametrize("next_n", [1, 3])
def test_a_batched_run_gives_each_case_its_alone_verdict_and_comparison(next_n):
    backends = get_backends(["torch", PLANTED_ALWAYS])
    cases = _members(next_n)
    alone = run(backends, cases, RunConfig())
    batch = merge(cases)
    batched = run(backends, [batch], RunConfig())
    assert _summary(batched) == _summary(alone)
    assert {r.verdict for r in alone if r.backend == "torch"} == {Verdict.PASS}
    assert not batch.diverged


def test_a_batch_splits_rows_and_columns_back_exactly():
    cases = _members(2)
    batch = merge(cases)
    assert batch.case.batch == sum(c.batch for c in cases)
    assert batch.case.max_model_len == max(c.max_model_len for c in cases)
    for index, case in enumerate(cases):
        first, rows = batch.spans[index]
        assert rows == case.rows and (batch.case.q[first // 2:first // 2 + case.batch] == case.q).all()
        offset = sum(c.k_pool.shape[0] for c in cases[:index])
        table = batch.case.block_table[first // 2:first // 2 + case.batch, :case.block_table.shape[1]]
        assert (table == case.block_table + offset).all()


@pytest.mark.parametrize("oracle", [OracleKind.EXACT, OracleKind.FAST])
def test_a_members_share_of_the_batch_oracle_is_its_own_oracle_answer(oracle):
    """What lets a member's re-run alone reuse its rows of the batch's answer instead of asking again."""
    cases = _members(3)
    batch = merge(cases)
    whole = make_reference(batch.case, oracle)
    for index, case in enumerate(cases):
        share, alone = batch.reference_of(whole, index), make_reference(case, oracle)
        assert torch.equal(share.logits, alone.logits) and torch.equal(share.row_lens, alone.row_lens)
        assert torch.equal(share.bound, alone.bound) and share.next_n == alone.next_n


def test_a_failure_only_in_a_batch_is_rerun_alone_and_kept_apart():
    cases = _members(2)
    batch = merge(cases)
    results = run(get_backends([PLANTED_BATCH]), [batch], RunConfig())
    assert [r.verdict for r in results] == [Verdict.PASS] * len(cases)  # alone, each is right
    (diverged,) = batch.diverged
    assert diverged.case == cases[-1].name and diverged.verdict == Verdict.FAIL_MASK
    whole = batch.whole["planted-batch-size"]  # the merged case, failed as a case of its own
    assert whole.case == batch.case.name and whole.verdict == Verdict.FAIL_MASK and whole.rows == batch.case.rows


def test_an_isolated_batch_reruns_a_failure_alone_in_the_worker():
    cases = _members(1)
    batch = merge(cases)
    results = run(get_backends(["torch", PLANTED_BATCH]), [batch], RunConfig(isolate=True))
    assert {r.verdict for r in results} == {Verdict.PASS}
    assert [r.backend for r in batch.diverged] == ["planted-batch-size"] and list(batch.whole) == [r.backend
                                                                                       for r in batch.diverged]


@dataclasses.dataclass(frozen=True)
class _Queueing(InProcess):
    """The in-process executor, saying it queues (as a worker over CUDA IPC does) and logging when each
    call is sent and when its outcome is asked for."""

    queues = True
    log: list = dataclasses.field(default_factory=list)
    rows: list = dataclasses.field(default_factory=list)  # of each call sent

    def submit(self, backend, inputs, launch):
        call = len([e for e in self.log if e[0] == "sent"])
        self.log.append(("sent", call))
        self.rows.append(launch.rows)
        wait = super().submit(backend, inputs, launch)
        return lambda: (self.log.append(("asked", call)), wait())[1]


def test_where_an_executor_queues_a_batchs_reruns_are_sent_ahead_with_the_same_results(monkeypatch):
    cases = _members(2)
    backends = get_backends([PLANTED_ALWAYS])
    plain = run(backends, [merge(cases)], RunConfig())
    executor = _Queueing()
    monkeypatch.setattr(runner, "InProcess", lambda: executor)
    queued = run(backends, [merge(cases)], RunConfig())
    assert _summary(queued) == _summary(plain)
    reruns = sum(r.verdict.failed for r in plain)
    assert reruns >= 2, "the planted bug fails at least two members, each re-run alone"
    # call 0 is the batch, call 1 the failed members together (they fail there too: no second round),
    # then one call per member alone: up to RERUNS_IN_FLIGHT of them are sent before the first one's
    # outcome is asked for, and each later one before the outcome of the one that many before it
    order = executor.log
    calls = [call for event, call in order if event == "sent"]
    assert len(calls) == 2 + reruns, f"{order=}"
    window = runner.RERUNS_IN_FLIGHT
    for k in range(3, 2 + reruns):
        asked_before = max(2, k - window)
        assert order.index(("sent", k)) < order.index(("asked", asked_before)) or k - window >= 2, f"{order=}"
        assert order.index(("sent", k)) < order.index(("asked", k - 1)), f"{order=}"
    assert all(order.index(("sent", k)) < order.index(("asked", 2)) for k in range(2, min(2 + reruns, 2 + window)))


PLANTED_AFTER_EMPTY = "tests.planted:wrong_after_empty_request"


def _neighbours(lengths: list[tuple[int, ...]]) -> list:
    return [build_case(CaseSpec(name=f"m{index}", batch=len(lens), next_n=2, max_model_len=24, lengths=lens,
                                **SHAPE), index) for index, lens in enumerate(lengths)]


def test_members_a_neighbour_spoiled_in_the_batch_pass_together_in_one_more_launch(monkeypatch):
    # m1 follows m0's empty request and m3 follows m2's: both fail in the batch, and neither follows an
    # empty request once they are launched together, so no member is run alone
    cases = _neighbours([(5, 0), (7, 9), (3, 0), (8, 4), (6, 6)])
    backends = get_backends([PLANTED_AFTER_EMPTY])
    alone = run(backends, cases, RunConfig())
    batch = merge(cases)
    executor = _Queueing()
    monkeypatch.setattr(runner, "InProcess", lambda: executor)
    batched = run(backends, [batch], RunConfig())
    assert _summary(batched) == _summary(alone) and {r.verdict for r in alone} == {Verdict.PASS}
    assert [r.case for r in batch.diverged] == [cases[1].name, cases[3].name]
    assert executor.rows == [batch.case.rows, 8], "the batch, then m1 and m3 together"


def test_a_member_still_spoiled_in_the_second_launch_is_run_alone_and_a_real_failure_stays_one(monkeypatch):
    # m1 (after m0's empty request) and m2 (after m1's) fail in the batch; launched with m3, m2 still
    # follows m1's empty request, and passes only in the second round. m3's own second request follows
    # its empty first one: it fails in every launch, and alone.
    cases = _neighbours([(5, 0), (7, 0), (8, 4), (0, 6)])
    backends = get_backends([PLANTED_AFTER_EMPTY])
    alone = run(backends, cases, RunConfig())
    executor = _Queueing()
    monkeypatch.setattr(runner, "InProcess", lambda: executor)
    batch = merge(cases)
    batched = run(backends, [batch], RunConfig())
    assert _summary(batched) == _summary(alone)
    assert [r.verdict for r in alone] == [Verdict.PASS] * 3 + [Verdict.FAIL_MASK]
    assert [r.case for r in batch.diverged] == [cases[1].name, cases[2].name]
    # the batch; m1, m2, m3 together (m1 passes); m3 and m2 together, in the reverse order (m2 passes); m3 alone
    assert executor.rows == [batch.case.rows, 12, 8, 4]
    name = backends[0].name
    assert batch.retries == [Retry(name, 3, 2), Retry(name, 2, 1), Retry(name, 1, 1)]


def test_the_next_item_is_drawn_while_a_batchs_launch_runs_and_each_item_is_done_once_its_results_are_in(
        monkeypatch):
    executor = _Queueing()
    monkeypatch.setattr(runner, "InProcess", lambda: executor)
    items = [merge(_members(2)), merge(_neighbours([(5, 3), (4, 4)])), _neighbours([(6, 2)])[0]]
    heard: list = []

    def drawn():
        for index, item in enumerate(items):
            executor.log.append(("drawn", index))
            yield item

    results = run(get_backends(["torch"]), drawn(), RunConfig(), on_result=heard.append,
                  on_done=lambda item: executor.log.append(("done", items.index(item))))
    log = executor.log
    # batch 0's call is sent, batch 1 drawn, then batch 0's answer asked for and batch 0 done
    assert log.index(("sent", 0)) < log.index(("drawn", 1)) < log.index(("asked", 0)) < log.index(("done", 0))
    assert log.index(("drawn", 2)) < log.index(("asked", 1)) < log.index(("done", 1)) < log.index(("done", 2))
    assert [r.case for r in results] == [r.case for r in heard] and len(results) == 4 + 2 + 1


def test_a_drawing_error_while_a_batch_runs_finishes_that_batch_first():
    members = _members(2)
    heard: list = []

    def drawn():
        yield merge(members)
        raise RuntimeError("drawing failed")

    with pytest.raises(RuntimeError, match="drawing failed"):
        run(get_backends(["torch"]), drawn(), RunConfig(), on_result=heard.append)
    assert [r.case for r in heard] == [m.name for m in members], "the batch's results came before the error"


def test_members_run_alone_are_compared_in_one_pass_with_the_comparisons_they_get_alone(monkeypatch):
    # Each member ends in an empty request: in every launch of several, each spoils the next one's first
    # request. m1 passes in the first retry launch; m5 in the second, which launches m2-m5 in the reverse
    # order (m5 first); m2, m3 and m4 are run alone, pass, and get their comparisons from one pass over
    # their outputs laid end to end, not one compare() each.
    cases = _neighbours([(5, 0), (7, 0), (8, 0), (6, 0), (4, 0), (9, 0)])
    backends = get_backends([PLANTED_AFTER_EMPTY])
    alone = run(backends, cases, RunConfig())
    executor = _Queueing()
    monkeypatch.setattr(runner, "InProcess", lambda: executor)
    compared_alone: list = []
    monkeypatch.setattr(call, "compare", lambda *args, **kwargs: compared_alone.append(args) or compare(*args,
                                                                                                        **kwargs))
    batch = merge(cases)
    batched = run(backends, [batch], RunConfig())
    assert _summary(batched) == _summary(alone) and {r.verdict for r in alone} == {Verdict.PASS}
    assert executor.rows == [batch.case.rows, 20, 16, 4, 4, 4], "the batch, m1-m5, m5-m2, then m2, m3, m4 alone"
    # compare() ran once: for the merged case itself, the failure kept in batch.whole
    assert [args[0].shape[0] for args in compared_alone] == [batch.case.rows], "no member was compared on its own"

