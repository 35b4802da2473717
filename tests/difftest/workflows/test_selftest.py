"""`difftest selftest` on the CPU: the correct and the nondeterministic mutants pass, every other mutant is caught
by the family its catalogue entry names (or its miss is explained by what the plan left out), and the score
is the report's `selftest` section.

The plan is narrowed to one case of each family the catalogue names (CASES): `difftest selftest --device cpu`
runs the whole plan (docs/selftest.md gives its time) and catches the same mutants by the same families.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from difftest.backends import mutants, ragged_mutants
from difftest.backends.torch_topk import TorchTopk
from difftest.backends.user import backend
from difftest.cli import main
from difftest.core.kinds import Device, ExitStatus, MaskConvention, MetamorphicRelation, TopkRelation
from difftest.core.schema import validate
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.plan import PlannedCase
from difftest.engine.result import CaseResult, Reach
from difftest.generators.envelope import EdgeFamily, Target
from difftest.generators.ragged import RaggedFamily, RaggedPlanned, build_ragged_case, ragged_plan
from difftest.operations.ragged import RAGGED_LOGITS
from difftest.records.report import Report
from difftest.records.score import Status
from difftest.workflows import selftest, selftest_operations
from difftest.workflows.fuzz import CampaignOutcome
from difftest.workflows.selftest import SelftestRequest
from tests import planted
from tests.user_backends import logits_with_limits

CASES = ("length-one-*", "shorter-than-next-n-*", "block-boundaries-*", "stale-canary-table-*",
         "random-mtp2-*")


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    report = tmp_path_factory.mktemp("selftest") / "report.json"
    return selftest.selftest(SelftestRequest(case_filter=CASES, report=report))


def test_the_mutants_that_must_pass_pass(scored):
    rows = {s.mutant: s for s in scored.scores}
    assert rows["mutant-correct"].status == rows["mutant-rotated-head-sum"].status == Status.PASSED
    assert rows["mutant-correct"].cases == rows["mutant-rotated-head-sum"].cases == len(CASES)
    assert rows["mutant-topk-correct"].status == rows["mutant-topk-random-ties"].status == Status.PASSED
    assert rows["mutant-topk-correct"].cases == rows["mutant-topk-random-ties"].cases > 20  # the whole top-k plan
    ragged = [p for p in ragged_plan(ragged_mutants.contract(), Target.small_cpu()) if isinstance(p, RaggedPlanned)]
    assert rows["mutant-ragged-correct"].status == rows["mutant-ragged-rotated-head-sum"].status == Status.PASSED
    assert rows["mutant-ragged-correct"].cases == rows["mutant-ragged-rotated-head-sum"].cases == len(ragged)


def test_every_other_mutant_is_caught_by_the_family_its_entry_names(scored):
    for spec, row in zip(mutants.CATALOGUE, scored.scores, strict=True):
        if spec.must_pass:
            continue
        if spec.production_only:  # SMALL scale leaves out every case past 2^31 bytes, 2^31 logits, 2^15 positions
            assert row.status == Status.MISSED and not row.expected_here and row.ok, row
            assert row.why.startswith(f"{spec.caught_by.value} left out: ") and "SMALL scale" in row.why, row.why
            continue
        assert row.status == Status.CAUGHT and row.caught_by[0] == spec.caught_by.value and row.ok, row
        assert row.first_case is not None and row.seconds is not None


def test_the_score_is_ok_and_in_the_report(scored):
    assert scored.status == ExitStatus.OK
    assert scored.summary().startswith("mutation score: 25 of 31 mutants caught (6 not reachable here, 6 of them "
                                       "production-only), 6 of 6 that must pass passed")
    document = json.loads(scored.written.read_text())
    validate(Report, document, "report ")
    assert document["selftest"]["status"] == "OK" and len(document["selftest"]["mutants"]) == len(mutants.CATALOGUE)
    ties = document["selftest"]["mutants"][-3]
    assert (ties["mutant"], ties["caught_by"][0], ties["first_case"]) == (
        "mutant-topk-candidate-buffer", "ties-past-2048", "ties-2049-s0")
    table = selftest.render_scores(scored)
    assert "mutant-after-empty" in table and table.endswith(scored.summary())
    assert "    production-only: pool-2^31-bytes left out: " in table
    assert "    production-only: keys-2^31-bytes left out: needs 33554432 keys of 64 bytes (2^31 bytes); " in table
    tiles = next(m for m in document["selftest"]["mutants"] if m["mutant"] == "mutant-ragged-tiles-from-key-0")
    assert (tiles["status"], tiles["caught_by"][0], tiles["ok"]) == ("caught", "tile-ends", True)


def test_a_templates_envelope_decides_what_can_be_caught():
    """A template whose tail is unspecified and whose next_n is 1: the bugs past each window and in draft rows
    cannot show there, and the score says so instead of failing."""
    template = "tests.difftest.workflows.test_selftest:single_row_lax_tail"
    done = selftest.selftest(SelftestRequest(template=template, case_filter=("length-one-*",),
                                             mutants=("correct", "window_past_end", "mirrored_window", "fp8_fnuz")))
    rows = {s.mutant: s for s in done.scores}
    assert rows["mutant-window-past-end"].why == ("not in the envelope: the tail judged (mask tail-neg-inf): the "
                                                  "contract's mask is tail-unspecified")
    assert rows["mutant-mirrored-window"].why.startswith("not in the envelope: draft rows (next_n >= 2)")
    assert rows["mutant-fp8-fnuz"].status == Status.CAUGHT and done.status == ExitStatus.OK
    assert done.contract.mask.value == "tail-unspecified" and done.template == template


@backend(contract=dataclasses.replace(planted.CONTRACT, next_n=(1,), mask=MaskConvention.TAIL_UNSPECIFIED),
         name="single-row-lax-tail")
def single_row_lax_tail(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """A template: a right kernel whose envelope has next_n 1 only and whose tail is unspecified."""
    return logits_with_limits(q, kv_cache, weights, context_lens.long(), block_table, max_model_len)


def test_an_expectation_that_does_not_hold_fails_the_selftest(monkeypatch):
    """A catch by the wrong family, and a mutant that must pass and fails, are both failures of the selftest."""
    wrong = (dataclasses.replace(mutants.BY_KEY["after_empty"], caught_by=EdgeFamily.TILE_MULTIPLES),
             dataclasses.replace(mutants.BY_KEY["fp8_fnuz"], must_pass=True))
    monkeypatch.setattr(mutants, "CATALOGUE", wrong)
    monkeypatch.setattr(mutants, "BY_KEY", {spec.key: spec for spec in wrong})
    done = selftest.selftest(SelftestRequest(case_filter=("shorter-than-next-n-*", "block-boundaries-*")))
    after, fnuz = done.scores
    assert after.status == Status.CAUGHT and not after.ok and after.why == (
        "expected tile-multiples, whose cases did not fail it")
    assert fnuz.status == Status.FALSE_POSITIVE and not fnuz.ok and fnuz.why.startswith("FAIL(value) on ")
    assert done.status == ExitStatus.FAILED


def test_a_ragged_expectation_that_does_not_hold_fails_the_selftest(monkeypatch):
    """As for the paged mutants: a ragged mutant caught by another family than its entry names, or one that must
    pass and fails, fails the selftest; a family the ragged plan has no case of explains a miss."""
    wrong = (dataclasses.replace(mutants.BY_KEY["ragged_head_group_weights"], caught_by=RaggedFamily.BUFFER_END),
             dataclasses.replace(mutants.BY_KEY["ragged_fp8_fnuz"], must_pass=True),
             dataclasses.replace(mutants.BY_KEY["ragged_end_inclusive"], caught_by=RaggedFamily.PRODUCTION))
    monkeypatch.setattr(mutants, "CATALOGUE", wrong)
    monkeypatch.setattr(mutants, "BY_KEY", {spec.key: spec for spec in wrong})
    done = selftest.selftest(SelftestRequest())
    heads, fnuz, end = done.scores
    assert heads.status == Status.CAUGHT and not heads.ok and heads.caught_by == ("heads",)
    assert heads.why == "expected buffer-end, whose cases did not fail it"
    assert fnuz.status == Status.FALSE_POSITIVE and not fnuz.ok and fnuz.why.startswith("FAIL(nan) on random-")
    assert end.status == Status.CAUGHT and end.ok and not end.expected_here
    assert end.why.startswith("production not reached here (production left out: 16384 rows over 131072 keys")
    assert done.status == ExitStatus.FAILED and not done.results  # no paged mutant ran


def test_a_ragged_miss_whose_family_cases_were_not_drawn_is_not_reachable_here_with_the_skip_reason(monkeypatch):
    """On a GPU other runs fill, the ragged plan's heads cases cannot be drawn: the mutants earn no verdict there
    (SKIPs), the head-group one's miss says which case and why, and the correct one still passes the rest."""
    def build(spec, seed, device):
        if spec.name.startswith("heads-"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (planted)")
        return build_ragged_case(spec, seed, device)

    undrawable = dataclasses.replace(RAGGED_LOGITS, build=build)
    monkeypatch.setattr(selftest_operations, "operation", lambda kind: undrawable)
    done = selftest.selftest(SelftestRequest(mutants=("ragged_correct", "ragged_head_group_weights")))
    correct, heads = done.scores
    assert correct.status == Status.PASSED and correct.ok
    assert heads.status == Status.MISSED and heads.ok and not heads.expected_here
    assert heads.why.startswith("heads: 2 of its cases skipped here, the first heads-16-s0: the case ran out of "
                                "memory before any call (drawing it: CUDA out of memory. Tried to allocate")
    assert done.status == ExitStatus.OK


def ticking(seconds_per_read: float) -> Callable[[], float]:
    """A campaign clock that moves `seconds_per_read` at each reading: a budget is then a number of readings, the
    same on a loaded machine as on an idle one."""
    readings = itertools.count()
    return lambda: next(readings) * seconds_per_read


def test_a_fuzz_round_alone_is_scored_by_any_family(capsys, monkeypatch):
    """Without the plan every paged mutant goes to the fuzz round, its seeds past the plan's, and a catch by
    any family counts; a production-only mutant is out of reach at small scale, by name of the scale. The round's
    clock ticks per reading (ticking), so what it draws does not depend on the machine's load."""
    campaign = selftest.fuzz.fuzz
    monkeypatch.setattr(selftest.fuzz, "fuzz", lambda *a, **k: campaign(*a, **k, now=ticking(0.5)))
    done = selftest.selftest(SelftestRequest(plan=False, budget=8, mutants=("correct", "fp8_fnuz", "positions_int16")))
    rows = {s.mutant: s for s in done.scores}
    seed = lambda case: int(case.rsplit("-s", 1)[1])  # noqa: E731
    assert done.fuzz_seconds and done.results and all(seed(r.case) >= selftest.FUZZ_SEED_OFFSET for r in done.results)
    fnuz = rows["mutant-fp8-fnuz"]
    assert fnuz.status == Status.CAUGHT and fnuz.ok and "fuzz" in fnuz.caught_by
    assert seed(fnuz.first_case) >= selftest.FUZZ_SEED_OFFSET
    assert fnuz.seconds is not None and fnuz.seconds <= done.seconds, "timed as its first failing result came"
    assert rows["mutant-correct"].status == Status.PASSED and rows["mutant-correct"].cases > 0
    int16 = rows["mutant-positions-int16"]
    assert int16.status == Status.MISSED and int16.ok
    assert int16.why == "needs production scale; this is a small-scale run"
    assert done.status == ExitStatus.OK
    assert main(["selftest", "--fuzz-only"]) == ExitStatus.USAGE
    assert "--budget=None: expected a fuzz round's seconds when the plan is not run" in capsys.readouterr().err


def test_a_fuzz_round_that_ran_no_case_of_a_family_does_not_count_its_mutant_as_missed(monkeypatch):
    """On a GPU other runs fill, the round may leave a large family out (or a short round not draw it): the
    mutant that family reaches is not reachable here, said with the family and the round's case count."""
    monkeypatch.setattr(selftest.fuzz, "fuzz", lambda campaign, **_: CampaignOutcome([], [], 0, 0.0))
    done = selftest.selftest(SelftestRequest(plan=False, budget=1, mutants=("correct", "stale_column", "fp8_fnuz")))
    rows = {s.mutant: s for s in done.scores}
    stale = rows["mutant-stale-column"]
    assert stale.status == Status.MISSED and stale.ok and not stale.expected_here
    assert stale.why == "stale-tables: the fuzz round ran no case of it (of 0 cases)"
    fnuz = rows["mutant-fp8-fnuz"]  # a random case can reach it: a miss is one
    assert fnuz.status == Status.MISSED and not fnuz.ok and fnuz.why == "the fuzz round's 0 cases did not fail it"
    assert done.status == ExitStatus.FAILED


def _undrawable(monkeypatch, prefix: str) -> None:
    """The planned paged cases named `prefix`... run out of memory being drawn, as on a GPU other runs fill."""
    real = PlannedCase.build

    def build(self, device, **kwargs):
        if self.name.startswith(prefix):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 958.00 MiB (planted)")
        return real(self, device, **kwargs)

    monkeypatch.setattr(PlannedCase, "build", build)


def test_a_case_that_runs_out_of_memory_being_drawn_scores_nothing_and_the_selftest_goes_on(monkeypatch):
    """A GPU shared with other runs: the plan's first case cannot be drawn; its results are SKIPs, and the
    mutant is caught by the next case of its family."""
    _undrawable(monkeypatch, "shorter-than-next-n")
    done = selftest.selftest(SelftestRequest(case_filter=("shorter-than-next-n-*", "length-one-*"),
                                             mutants=("correct", "after_empty")))
    skipped = [r for r in done.results if r.case.startswith("shorter-than-next-n")]
    assert skipped and {r.verdict for r in skipped} == {Verdict.SKIP}
    assert "ran out of memory" in skipped[0].reason
    rows = {s.mutant: s for s in done.scores}
    assert rows["mutant-correct"].status == Status.PASSED


def test_a_miss_whose_family_case_was_not_drawn_is_not_reachable_here_with_the_skip_reason(monkeypatch):
    """The plan's only case of the mutant's family ran out of memory being drawn: the mutant earned no verdict
    there, so its miss is no weakness of the configuration; the row says which case and why."""
    _undrawable(monkeypatch, "shorter-than-next-n")
    done = selftest.selftest(SelftestRequest(case_filter=("shorter-than-next-n-*",), mutants=("after_empty",)))
    (after,) = done.scores
    assert after.status == Status.MISSED and after.ok and not after.expected_here
    assert after.why.startswith("short-lengths: 1 of its cases skipped here, the first shorter-than-next-n-s")
    assert "not drawn: drawing the case ran out of memory (OutOfMemoryError: CUDA out of memory." in after.why
    assert done.status == ExitStatus.OK


def _fuzz_result(case: str, verdict: Verdict, reason: str | None = None) -> CaseResult:
    return CaseResult(backend="mutant-stale-column", case=case, description="B=2", rows=4, verdict=verdict,
                      device="cpu", encoding=None, layout=None, overridden=False, seconds=0.01, reason=reason,
                      reach=Reach(("stale-tables",), 64, 4096, 2))


def test_a_fuzz_round_whose_family_case_was_skipped_explains_the_miss_by_it(monkeypatch):
    """As on the H200 beside other jobs: one case of the family ran and passed (it cannot reach the bug), the
    other was not drawn for memory. The miss is the skip's, not "the round's cases did not fail it"."""
    undrawn = "not drawn: drawing the case ran out of memory (OutOfMemoryError: CUDA out of memory.)"
    results = [_fuzz_result("stale-under-s7000001", Verdict.PASS),
               _fuzz_result("stale-over-s7000002", Verdict.SKIP, undrawn)]
    monkeypatch.setattr(selftest.fuzz, "fuzz", lambda campaign, **_: CampaignOutcome(results, [], 1, 1.0))
    done = selftest.selftest(SelftestRequest(plan=False, budget=1, mutants=("stale_column",)))
    (stale,) = done.scores
    assert stale.status == Status.MISSED and stale.ok and not stale.expected_here
    assert stale.why == f"stale-tables: 1 of its cases skipped here, the first stale-over-s7000002: {undrawn}"


def test_the_command_line(tmp_path, capsys):
    report = tmp_path / "r.json"
    status = main(["selftest", "--mutants", "correct,after-empty", "--case-filter", "shorter-than-next-n-*",
                   "--report", str(report), "-q"])
    out = capsys.readouterr().out
    assert status == 0 and out.startswith("mutation score: 1 of 1 mutants caught (0 not reachable here, 0 of them "
                                          "production-only), 1 of 1")
    assert json.loads(report.read_text())["selftest"]["mutants"][1]["first_case"] == "shorter-than-next-n-s2000"
    status = main(["selftest", "--mutants", "ragged-correct,mutant-ragged-empty-window-key", "-q"])
    assert status == 0 and capsys.readouterr().out.startswith("mutation score: 1 of 1 mutants caught (0 not "
                                                             "reachable here, 0 of them production-only), 1 of 1")
    assert main(["selftest", "--mutants", "nope"]) == ExitStatus.USAGE
    assert "--mutants='nope': expected catalogue keys among" in capsys.readouterr().err
    assert main(["selftest", "--repeat", "1"]) == ExitStatus.USAGE


def test_the_selftest_page_names_every_mutant_and_relation():
    text = (Path(__file__).resolve().parents[3] / "docs" / "selftest.md").read_text()
    names = [spec.name for spec in mutants.CATALOGUE] + [r.value for r in (*MetamorphicRelation, *TopkRelation)]
    assert not [name for name in names if f"`{name}`" not in text]


@pytest.mark.parametrize(("template", "fits"), [
    (dataclasses.replace(TorchTopk.contract, max_k=64, max_width=512, library="narrow topk"),
     lambda spec: spec.k <= 64 and spec.width <= 512),
    (dataclasses.replace(ragged_mutants.contract(), heads=(32,), head_dims=(64,), library="narrow ragged"),
     lambda spec: (spec.heads, spec.head_dim) == (32, 64)),
], ids=["topk", "ragged"])
def test_a_templates_envelope_bounds_its_operations_mutants_plan(template, fits):
    """A top-k or ragged template: its operation's mutants plan and run inside its envelope only."""
    kind = template.operation
    correct = next(s for s in mutants.CATALOGUE if s.operation == kind and s.must_pass)
    tallies = selftest_operations.run_operations([correct], Target.probe(Device.CPU), RunConfig(repeat=2), 0, 0.0,
                                                 template=template)
    planned = tallies[kind].cases
    assert planned and all(fits(p.spec) for p in planned) and tallies[kind].ran[correct.name] > 0
    envelope = selftest_operations.operation_envelope(kind, template)
    assert envelope.library.endswith(f"in the envelope of {template.library}")
