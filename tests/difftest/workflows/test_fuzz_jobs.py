"""`difftest fuzz --jobs N`: campaigns side by side in child processes, each its share of one plan (job 0
every large case), their outcomes joined into one (one bundle per signature, one stream), stopped once
their signatures together reach the failure count; a job that dies or raises costs only its own results."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time

import pytest
import torch

from difftest.backends import get_backends
from difftest.cli import main
from difftest.core import memory
from difftest.core.errors import SpecError
from difftest.core.kinds import Device, ExitStatus
from difftest.core.memory import JOB_PROCESS_BYTES, SMALL_JOB_BYTES
from difftest.core.verdict import Verdict
from difftest.engine import plan
from difftest.engine.config import RunConfig
from difftest.engine.plan import PlannedCase
from difftest.generators.envelope import Target
from difftest.generators.regime import Regime
from difftest.workflows.fuzz import (
    MAX_JOBS,
    Campaign,
    CampaignOutcome,
    _gathered,
    _job_target,
    _joined,
    _Link,
    _reserve,
    _small,
    _where,
    fuzz,
    planned_cases,
    render_campaign,
)
from difftest.workflows.signatures import Signature
from tests.support import TINY

PLANTED = "tests.user_backends:window_one_short"
SMALL = Regime(max_batch=4, max_context=64)


def test_jobs_deal_out_one_plan_in_turn_and_job_0_draws_every_large_case(monkeypatch):
    # Planned for an H200-sized target (planning needs no GPU: torch's "no CUDA here" set aside), so the
    # plan holds large cases (2^31-logit ones, 128K contexts) among the small ones.
    monkeypatch.setattr(plan, "_idle_reason", lambda backend, target: None)
    target = Target.production_gpu(132, 100 << 30)
    cases = list(itertools.islice(planned_cases(get_backends(["torch"]), target, Regime(), 0), 300))
    large = {case.name for case in cases if not _small(case)}
    assert large and len(large) < len(cases), "the plan has both sizes, or this test proves nothing"
    shares = [[case.name for case in _Link(index, 3, None, None, target, 0.0).takes(cases)] for index in range(3)]
    assert sorted(name for share in shares for name in share) == sorted(case.name for case in cases), \
        "every planned case is drawn, by one job"
    assert large <= set(shares[0]) and not large & (set(shares[1]) | set(shares[2]))
    small = [case.name for case in cases if case.name not in large]
    assert shares[1] == small[1::3] and shares[2] == small[2::3], "the small cases dealt out in turn"
    assert [name for name in shares[0] if name not in large] == small[0::3]


def test_a_job_whose_places_in_the_plan_hold_only_large_cases_still_draws_small_ones(monkeypatch):
    # a plan alternating small and large: by place, job 1 of 2 would only ever be offered large cases
    plan_round = [PlannedCase(TINY.replace(name=f"c{i}", max_model_len=64 if i % 2 == 0 else 1 << 20), i)
                  for i in range(4)]
    shares = [list(itertools.islice(_Link(index, 2, None, None, Target.small_cpu(), 0.0).takes(
        itertools.cycle(plan_round)), 3)) for index in range(2)]
    assert all(_small(case) for case in shares[1]) and len(shares[1]) == 3


def test_jobs_plan_for_the_memory_job_0_may_use_and_never_less_than_half():
    probed = Target.probe(Device.CPU).memory_bytes
    planned = _job_target(Campaign(budget=1.0, backends=("torch",), jobs=4), 1).memory_bytes  # CPU: no contexts
    assert abs(planned - (probed - min(3 * SMALL_JOB_BYTES, probed // 2))) <= probed // 100
    crowded = _job_target(Campaign(budget=1.0, backends=("torch",), jobs=MAX_JOBS), 1).memory_bytes
    assert abs(crowded - probed // 2) <= probed // 100, "64 jobs' reserve is capped at half"
    on_gpu = Campaign(budget=1.0, backends=("torch",), jobs=2, config=RunConfig(device="cuda"))  # isolated
    assert _reserve(on_gpu, 1) == SMALL_JOB_BYTES + 2 * 2 * JOB_PROCESS_BYTES, \
        "on a GPU each process keeps a context: two jobs, each the job and one worker"


def test_two_jobs_find_the_planted_bug_stop_together_and_join_their_results(tmp_path):
    stream, repro = tmp_path / "fuzz.jsonl", tmp_path / "repro"
    outcome = fuzz(Campaign(budget=120.0, backends=("torch", PLANTED), until_failures=1, regime=SMALL, jobs=2,
                            stream=stream, repro_dir=repro, shrink_seconds=0))
    assert outcome.jobs == 2 and not outcome.lost_jobs
    assert outcome.seconds < 60, "the first job to find a failure stopped both long before the budget"
    assert {f.signature.backend for f in outcome.found} == {"window-one-short"}
    assert all(f.bundle is not None and f.bundle.parent == repro for f in outcome.found)
    pairs = [(r.backend, r.case) for r in outcome.results]
    assert len(pairs) == len(set(pairs)), "the jobs drew no case twice"
    lines = [json.loads(line) for line in stream.read_text().splitlines()]
    assert sorted((line["result"]["backend"], line["result"]["case"]) for line in lines) == sorted(pairs)
    assert not list(tmp_path.glob("fuzz.jsonl.job*")), "the parts were joined into the stream"
    assert "(2 jobs side by side)" in render_campaign(outcome)


def test_a_plan_without_small_cases_runs_as_one_job_within_its_budget(monkeypatch):
    # every case counted large: jobs other than job 0 would draw nothing and never reach their budget check
    monkeypatch.setattr(memory, "SMALL_LOGITS", 0)
    outcome = fuzz(Campaign(budget=2.0, backends=("torch",), regime=SMALL, jobs=2, shrink_seconds=0))
    assert outcome.jobs == 1 and outcome.cases > 0 and outcome.seconds < 30, render_campaign(outcome)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
def test_two_jobs_on_the_gpu_each_with_their_own_workers_find_the_planted_bug(tmp_path):
    outcome = fuzz(Campaign(budget=120.0, backends=("torch", PLANTED), until_failures=1, jobs=2, shrink_seconds=0,
                            config=RunConfig(device="cuda"), regime=Regime(max_batch=4, max_context=4096)))
    assert outcome.jobs == 2 and not outcome.lost_jobs and outcome.found, render_campaign(outcome)
    assert {f.signature.backend for f in outcome.found} == {"window-one-short"}
    assert all(f.case.device.type == "cuda" for f in outcome.found), "found cases back on the campaign's device"
    assert {r.isolation is not None for r in outcome.results} == {True}, "isolated: each job ran its own workers"


def _signs_then_waits(backend: str, stop, send) -> None:
    """A job that finds one signature, then answers once the campaign's stop is set (or after 60 s, with
    began -1: never stopped)."""
    link = _Link(0, 2, stop, send, Target.small_cpu(), 0.0)
    link.tell(("found", Signature(backend, Verdict.FAIL_MASK)))
    stopped = stop.wait(60)
    link.tell(("done", (CampaignOutcome([], [], 0, 0.0), time.monotonic() if stopped else -1.0)))


def _job_pair(target, args_of) -> tuple[list, object]:
    context = multiprocessing.get_context("spawn")
    stop, jobs = context.Event(), []
    for index in range(2):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=target, args=args_of(index, stop, send))
        process.start()
        send.close()
        jobs.append((receive, process))
    return jobs, stop


def test_the_jobs_signatures_together_reach_the_failure_count_and_stop_them_all():
    # each job alone found one signature: only the two together make the campaign's two
    jobs, stop = _job_pair(_signs_then_waits, lambda index, stop, send: (f"backend-{index}", stop, send))
    start = time.monotonic()
    outcomes, lost = _gathered(jobs, stop, until_failures=2)
    assert not lost and len(outcomes) == 2 and all(began > 0 for _outcome, began in outcomes)
    assert time.monotonic() - start < 50, "stopped by the two signatures, not by the jobs' own 60-s wait"
    for _receive, process in jobs:
        process.join()


def test_a_job_that_dies_is_named_with_how_and_the_others_outcomes_are_kept():
    jobs, stop = _job_pair(_dies_or_signs, lambda index, stop, send: (index, stop, send))
    outcomes, lost = _gathered(jobs, stop, until_failures=1)
    assert lost == ("job 0 died (exited with status 3) before handing its results over",)
    assert len(outcomes) == 1
    for _receive, process in jobs:
        process.join()


def _dies_or_signs(index: int, stop, send) -> None:
    if index == 0:
        os._exit(3)
    _signs_then_waits("backend-1", stop, send)


def _raises_or_signs(index: int, stop, send) -> None:
    if index == 0:
        _Link(0, 2, stop, send, Target.small_cpu(), 0.0).tell(("raised", "OutOfMemoryError: CUDA out of memory."))
        return
    _signs_then_waits("backend-1", stop, send)


def test_a_job_that_raises_is_lost_with_its_exceptions_line_and_the_campaign_goes_on():
    jobs, stop = _job_pair(_raises_or_signs, lambda index, stop, send: (index, stop, send))
    outcomes, lost = _gathered(jobs, stop, until_failures=1)
    assert lost == ("job 0 raised OutOfMemoryError: CUDA out of memory.",) and len(outcomes) == 1
    for _receive, process in jobs:
        process.join()


def test_joined_jobs_keep_every_jobs_cases_not_drawn():
    outcomes = [(CampaignOutcome([], [], 3, 1.0, undrawn=(f"case-{index}: OutOfMemoryError: ...",)), 0.0)
                for index in range(2)]
    joined = _joined(outcomes, Campaign(budget=1.0, jobs=2), (), 0.0, 2.0)
    assert joined.undrawn == ("case-0: OutOfMemoryError: ...", "case-1: OutOfMemoryError: ...")
    assert joined.cases == 6 and joined.jobs == 2


def _allocates() -> None:
    raise MemoryError("asked for 5.82 GiB")


def test_a_raising_jobs_line_says_where_it_raised():
    """A lost job's line is all that comes back of it: it names the innermost frame, so an out-of-memory
    error in one of four jobs can be traced without its traceback."""
    try:
        _allocates()
    except MemoryError as exc:
        where = _where(exc)
    assert where == f"workflows/test_fuzz_jobs.py:{_allocates.__code__.co_firstlineno + 1} (_allocates)"


def test_jobs_out_of_range_and_an_impossible_regime_are_one_line_each(capsys):
    with pytest.raises(SpecError, match="jobs"):
        Campaign(budget=1.0, jobs=0)
    with pytest.raises(SpecError, match="timed"):
        Campaign(budget=1.0, jobs=2, config=RunConfig(time=5))
    assert main(["fuzz", "--budget", "1", "--backends", "torch", "--jobs", "2", "--heads", "7"]) == ExitStatus.USAGE
    assert "heads" in capsys.readouterr().err
