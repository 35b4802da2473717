"""`difftest fuzz` within its budget: drawing, running and shrinking together end at the budget (by the
campaign's own record of its phases), shrinking needs no repro dir, and a terminal gets a progress line."""

from __future__ import annotations

import shutil
import sys
import time

import pytest

from difftest.backends import as_loaded
from difftest.cli import main
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus
from difftest.engine.config import RunConfig
from difftest.generators import build_case
from difftest.generators.regime import Regime
from difftest.records.run_info import Phases
from difftest.records.serialize import load_results, load_run_info
from difftest.workflows.fuzz import SHRINK_SHARE, Campaign, fuzz, render_campaign, repro_line
from difftest.workflows.running import run_one
from tests.planted import SLOW_CALL, slow_last_column
from tests.support import TINY

SLOW = "tests.planted:slow_last_column"
BUDGET, SHARE = 4.0, 2.0


@pytest.fixture(scope="module")
def slow_campaign(tmp_path_factory):
    # One call first: a process's first torch work (seconds on a loaded machine) is not what this measures.
    run_one(as_loaded(slow_last_column), build_case(TINY, 0), RunConfig())
    report = tmp_path_factory.mktemp("budget") / "fuzz.json"
    outcome = fuzz(Campaign(budget=BUDGET, backends=(SLOW,), shrink_seconds=SHARE, report=report,
                            regime=Regime(max_batch=4, max_context=64, block_size=16)))
    yield outcome, report
    if outcome.bundles is not None:
        shutil.rmtree(outcome.bundles)


def _overrun(outcome) -> float:
    """What may pass the budget, by the campaign's own record: the case or probe under way when time runs
    out (twice its slowest call: a probe also draws its case and runs the oracle), and the bundle of the
    shrunk case. On a loaded machine the calls take longer, and so may the overrun."""
    calls = [r.seconds for r in outcome.results] + [f.shrunk.result.seconds for f in outcome.found if f.shrunk]
    return 2 * max(calls, default=SLOW_CALL) + 0.5


def test_the_budget_bounds_drawing_running_and_shrinking(slow_campaign):
    outcome, _report = slow_campaign
    phases, text, overrun = outcome.phases, render_campaign(outcome), _overrun(outcome)
    shrunk = [found.shrunk for found in outcome.found if found.shrunk is not None]
    assert shrunk and not shrunk[-1].finished, f"shrinking wanted more than its share: {text}"
    assert phases.total <= BUDGET + overrun, text
    assert phases.cases <= BUDGET - SHARE + overrun, "drawing stopped to leave the shrinking share"
    assert phases.shrinking > SHARE / 2, "the shrinking share was spent shrinking"
    assert f"campaign: {phases.total:.1f} s of a 4-s budget: cases {phases.cases:.1f} s" in text


def test_shrinking_without_a_repro_dir_goes_to_a_temporary_folder_it_names(slow_campaign):
    outcome, _report = slow_campaign
    found = outcome.found[0]
    assert outcome.temporary and outcome.bundles is not None and outcome.bundles.is_dir()
    assert found.bundle.parent == outcome.bundles and found.shrunk_bundle.parent == outcome.bundles
    assert f"bundles: {outcome.bundles} (a temporary folder)" in render_campaign(outcome)


def test_the_report_holds_every_result_and_the_signatures_with_their_variants(slow_campaign):
    outcome, report = slow_campaign
    assert len(load_results(report, "report")) == len(outcome.results)
    [info] = load_run_info(report, "report")
    campaign = info["campaign"]
    assert Phases.from_json(campaign["phases"], "campaign.phases.") == outcome.phases, "its phases read back"
    sign = campaign["signatures"][0]
    assert len(campaign["signatures"]) == len(outcome.found)
    assert (sign["backend"], sign["verdict"], sign["results"]) == ("planted-slow-last-column", "FAIL(mask)",
                                                                  outcome.found[0].seen)
    assert sum(sign["variants"]["draft_rows"].values()) == sign["results"] and sign["variants"]["shapes"]
    assert sign["repro"].startswith("difftest run --backends tests.planted:slow_last_column --spec ")
    assert campaign["phases"]["total"] == outcome.phases.total and info["budget"] == BUDGET


def test_the_shrinking_share_defaults_to_a_part_of_the_budget_and_fits_in_it():
    assert Campaign(budget=100.0).shrink_budget == SHRINK_SHARE * 100.0
    assert Campaign(budget=100.0, shrink_seconds=0).shrink_budget == 0.0
    with pytest.raises(SpecError) as caught:
        Campaign(budget=10.0, shrink_seconds=11.0)
    assert caught.value.field == "shrink_seconds" and "budget = 10" in caught.value.expected


def _fuzz_quietly(capsys, *options: str) -> tuple[int, str]:
    status = main(["fuzz", "--budget", "1s", "--backends", "torch", "--max-batch", "2", "--max-context", "32",
                   *options])
    return status, capsys.readouterr().err


def test_the_progress_line_is_drawn_on_a_terminal_only(capsys, monkeypatch):
    status, err = _fuzz_quietly(capsys)
    assert status == ExitStatus.OK and "signatures" not in err, "stderr is no terminal: no progress line"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    status, err = _fuzz_quietly(capsys)
    assert status == ExitStatus.OK and "fuzz " in err and " cases, 0 signatures, drawing cases" in err, err
    status, err = _fuzz_quietly(capsys, "--no-progress")
    assert "signatures" not in err


def test_a_campaign_whose_drawing_spends_its_budget_still_shrinks_its_first_failure():
    """Drawing past the budget's end (a case under way, a batch's retries: a 2-minute GPU campaign found 9 bugs
    and shrank none, '0.0 s left') does not eat the shrinking share. The campaign's clock jumps a day at its
    first failing result, as if that case had run that long; the share still starts when drawing ends."""
    skew = [0.0]

    def heard(result):
        if result.verdict.failed:
            skew[0] = 86400.0

    outcome = fuzz(Campaign(budget=600.0, backends=("tests.user_backends:window_one_short",), shrink_seconds=300.0,
                            regime=Regime(max_batch=4, max_context=64, block_size=16)),
                   on_result=heard, now=lambda: time.monotonic() + skew[0])
    try:
        found = outcome.found[0]
        assert found.unshrunk is None and found.shrunk is not None, render_campaign(outcome)
        assert found.shrunk.probes > 1 and found.shrunk.finished, "probes made it smaller, to a case it keeps"
        assert found.shrunk.case.rows < found.case.rows or found.shrunk.case.max_model_len < found.case.max_model_len
        assert "repro: difftest run" in render_campaign(outcome) and "-min" in repro_line(found, outcome.config)
    finally:
        if outcome.bundles is not None:
            shutil.rmtree(outcome.bundles)
