"""`difftest fuzz`: a budgeted campaign finds a planted bug, bundles it, shrinks it and prints a line
that draws it again."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from difftest.backends import get_backends
from difftest.cli import main
from difftest.core.errors import Interrupted, SpecError
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.engine.batch import Retry, batch_key
from difftest.engine.config import RunConfig
from difftest.engine.plan import PlannedCase
from difftest.generators.regime import Regime
from difftest.records.serialize import load_results
from difftest.workflows import fuzz as fuzz_module
from difftest.workflows.fuzz import (
    BATCH_LOGITS,
    BATCH_MERGED_LOGITS,
    SMALL_LOGITS,
    Campaign,
    describe_retries,
    fuzz,
    render_campaign,
    repro_line,
)
from tests.support import TINY

PLANTED = "tests.user_backends:window_one_short"
TOY = Regime(max_batch=4, max_context=64)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    repro = tmp_path_factory.mktemp("fuzz")
    return repro, fuzz(Campaign(budget=60.0, backends=("torch", PLANTED), until_failures=1, repro_dir=repro,
                                shrink_seconds=10.0))


def test_a_campaign_finds_the_planted_bug_and_stops_at_the_failure_count(campaign):
    _, outcome = campaign
    assert len(outcome.found) == 1 and outcome.found[0].signature.verdict == Verdict.FAIL_MASK, outcome.found
    assert outcome.found[0].signature.backend == "window-one-short"
    assert outcome.cases >= 1 and outcome.cases_per_second > 0
    assert "1 distinct failures" in render_campaign(outcome)


def test_the_first_case_of_a_signature_is_bundled_and_shrunk_to_a_line_that_draws_it(campaign, capsys):
    repro, outcome = campaign
    found = outcome.found[0]
    assert found.bundle is not None and found.bundle.parent == repro and found.shrunk is not None
    assert found.shrunk.case.batch == 1, found.shrunk.case.describe()
    words = shlex.split(repro_line(found, outcome.config))
    assert words[:4] == ["difftest", "run", "--backends", PLANTED], words
    assert main([*words[1:], "--no-progress"]) == ExitStatus.FAILED, "the repro line reproduces the failure"
    assert "FAIL(mask)" in capsys.readouterr().out


def test_the_cli_campaign_exits_1_on_a_failure_and_0_without(capsys):
    assert main(["fuzz", "--budget", "5s", "--backends", f"torch,{PLANTED}", "--until-failures", "1",
                 "--shrink-seconds", "0"]) == ExitStatus.FAILED
    assert main(["fuzz", "--budget", "2s", "--backends", "torch"]) == ExitStatus.OK
    out = capsys.readouterr().out
    assert "cases/s" in out and "0 distinct failures" in out


@pytest.mark.parametrize(("changes", "field"), [(dict(budget=0), "budget"), (dict(until_failures=0), "until_failures")])
def test_bad_campaigns_name_the_field(changes, field):
    with pytest.raises(SpecError) as info:
        Campaign(**{"budget": 1.0, **changes})
    assert info.value.field == field


def test_the_retries_line_counts_launches_members_and_what_passed():
    retries = (Retry("k", 5, 2), Retry("k", 2, 0), Retry("k", 1, 1), Retry("k", 1, 0))
    assert describe_retries(retries) == ("tried again: 2 launches of a batch's failed members together (7 members, "
                                         "5 passing there), 2 members alone (1 failing)")


def test_a_batch_closes_before_its_merged_shape_passes_the_cap(monkeypatch):
    """The merged case is all members' rows by the widest max_model_len: one wide small case (1 row of
    2^20) among cases of 128 rows at 4K would make it far larger than the members' own logits say."""
    wide = PlannedCase(TINY.replace(name="wide", batch=1, max_model_len=1 << 20), 0)
    narrow = [PlannedCase(TINY.replace(name=f"narrow{i}", batch=128, max_model_len=1 << 12), i) for i in range(40)]
    plan = [narrow[0], wide, *narrow[1:]]
    assert all(fuzz_module._small(p) for p in plan) and len({batch_key(p.spec) for p in plan}) == 1
    monkeypatch.setattr(fuzz_module, "planned_cases", lambda *args: iter(plan))
    state = fuzz_module._State(Campaign(budget=1.0, backends=("torch",)), get_backends(["torch"]))
    batches = [job for job in state._jobs() if isinstance(job, list)]
    merged = [sum(p.spec.batch for p in b) * max(p.spec.max_model_len for p in b) for b in batches]
    assert max(merged) <= BATCH_MERGED_LOGITS, merged
    own = sum(p.spec.batch * p.spec.max_model_len for p in plan[:2])
    assert own <= BATCH_LOGITS - SMALL_LOGITS, "by its own logits the wide case would have joined the first batch"
    assert [p.spec.name for p in batches[0]] == ["narrow0"], "the first batch closed when the wide case came"


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB.")


def test_a_case_that_runs_out_of_memory_being_drawn_is_a_skip_in_the_report_and_the_campaign_goes_on(
        monkeypatch, tmp_path):
    # A large case is drawn alone, in the campaign's thread: on a GPU other campaigns share, the memory the
    # plan counted on may be gone. Its SKIP keeps it in the report, with the families it was planned for.
    build = PlannedCase.build
    first: list[PlannedCase] = []

    def build_but_the_first(planned, device, validate=True):
        if not first or planned.name == first[0].name:
            first.append(planned)
            _out_of_memory()
        return build(planned, device, validate)

    monkeypatch.setattr(PlannedCase, "build", build_but_the_first)
    report = tmp_path / "fuzz.json"
    outcome = fuzz(Campaign(budget=3.0, backends=("torch",), regime=TOY, batching=False, report=report))
    name = first[0].name
    (skip,) = [r for r in outcome.results if r.case == name]
    assert skip.verdict == Verdict.SKIP
    assert skip.reason.startswith("not drawn: drawing the case ran out of memory (OutOfMemoryError: CUDA out of "
                                  "memory. Tried to allocate 12.00 GiB.); it needs about ")
    assert skip.reach is not None and skip.reach.families == first[0].families
    assert outcome.undrawn == (f"{name}: {skip.reason}",)
    assert any(r.case != name and r.verdict == Verdict.PASS for r in outcome.results), "the campaign went on"
    assert name in {r.case for r in load_results(report)}
    assert "not drawn: 1 planned cases ran out of memory being drawn (each a SKIP in the report" in \
        render_campaign(outcome)


def test_a_batch_that_runs_out_of_memory_being_drawn_skips_its_members_and_the_campaign_goes_on(monkeypatch):
    together = fuzz_module.build_together
    calls = iter(range(1_000_000))
    monkeypatch.setattr(fuzz_module, "build_together",
                        lambda job, device: _out_of_memory() if next(calls) == 0 else together(job, device))
    outcome = fuzz(Campaign(budget=3.0, backends=("torch",), regime=TOY))
    assert outcome.undrawn and outcome.launches, "the first batch not drawn, later ones run"
    undrawn = {line.split(":")[0] for line in outcome.undrawn}
    skips = [r for r in outcome.results if r.case in undrawn]
    assert {r.case for r in skips} == undrawn and all(r.verdict == Verdict.SKIP for r in skips)
    assert all("Tried to allocate 12.00 GiB.); it needs about" in r.reason for r in skips)
    assert all(r.reason.endswith(f"(drawn in a batch of {len(undrawn)} cases)") for r in skips)
    assert any(r.verdict == Verdict.PASS for r in outcome.results), "later batches ran"


def test_a_shrink_that_raises_keeps_the_bundle_and_says_why(monkeypatch, tmp_path):
    # Shrinking runs the kernel in the campaign's process: a probe that faults the device (an out-of-bounds
    # write leaves the CUDA context unusable) raises from the oracle or the kernel on every later probe.
    def faulted(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors ...")

    monkeypatch.setattr(fuzz_module, "shrink", faulted)
    outcome = fuzz(Campaign(budget=60.0, backends=("torch", PLANTED), until_failures=1, repro_dir=tmp_path,
                            shrink_seconds=10.0))
    [found] = outcome.found
    assert found.bundle is not None and found.bundle.exists() and found.shrunk is None
    assert found.unshrunk == "shrinking raised RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "not shrunk: shrinking raised RuntimeError: CUDA error" in render_campaign(outcome)


def test_an_isolated_campaign_shrinks_a_crash_in_a_worker_and_keeps_a_hang_as_found(tmp_path):
    # Shrink probes run where the campaign runs the backend: a crash costs a worker, not the campaign.
    crash, hang = "tests.broken_backends:segfaults_past_64", "tests.broken_backends:hangs"
    regime = Regime(max_batch=4, max_context=256)
    crashed = fuzz(Campaign(budget=180.0, backends=(crash,), config=RunConfig(isolate=True), until_failures=1,
                            repro_dir=tmp_path / "crash", shrink_seconds=120.0, regime=regime))
    [found] = crashed.found
    assert found.signature.verdict == Verdict.CRASH and found.shrunk is not None, found.unshrunk
    assert found.shrunk.case.seq_lens.tolist() == [65], found.shrunk.line()
    # Every probe of a hang would cost a whole timeout: its bundle stays as found.
    hung = fuzz(Campaign(budget=180.0, backends=(hang,), config=RunConfig(timeout=2.0), until_failures=1,
                         repro_dir=tmp_path / "hang", shrink_seconds=120.0, regime=regime))
    [found] = hung.found
    assert found.signature.verdict == Verdict.TIMEOUT and found.bundle is not None
    assert found.shrunk is None and found.unshrunk is None


def test_a_stop_while_shrinking_keeps_the_cases_results_in_the_report_marked_incomplete(monkeypatch, tmp_path):
    """SIGTERM (a job's time limit) or Ctrl-C in the last phase: what the cases found is whole, and kept."""
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fuzz_module, "_kept", stopped)
    report = tmp_path / "f.json"
    with pytest.raises(Interrupted) as raised:
        fuzz(Campaign(budget=3.0, backends=("torch", PLANTED), until_failures=1, regime=TOY, report=report))
    assert raised.value.kept == (str(report),) and not raised.value.resumable
    doc = json.loads(report.read_text())
    assert doc["run"]["incomplete"] is True and doc["run"]["campaign"]["signatures"]
    assert len(doc["results"]) == raised.value.results > 0


def test_an_isolated_campaign_with_no_timeout_waits_on_a_call_at_most_its_budget():
    """A call that never answers (FlagGems' metadata compiling for minutes at 65537 requests on the H200) must
    end as a TIMEOUT inside the campaign, not keep the campaign 600 s past its budget."""
    isolated = Campaign(budget=90.0, config=RunConfig(isolate=True))
    assert fuzz_module.bounded(isolated).config.timeout == 90.0
    assert fuzz_module.bounded(Campaign(budget=3600.0, config=RunConfig(isolate=True))).config.timeout == 600.0
    chosen = Campaign(budget=90.0, config=RunConfig(timeout=500.0))
    assert fuzz_module.bounded(chosen) is chosen  # the user's --timeout stands
    in_process = Campaign(budget=90.0)  # the CPU's default: no workers, nothing to time out
    assert fuzz_module.bounded(in_process) is in_process
