"""`pytest --difftest-suite`: ids, the summary section, and a planted off-by-one found with its row table."""

from __future__ import annotations

import json
import sys

import pytest

from difftest import cli
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.records.bundle import load_bundle

SUITE = ["--difftest-suite", "--difftest-seed=4000"]  # edge seeds: all-padding s4000, length-one s5000, ...


def test_the_suite_is_collected_without_a_test_file(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--co", "-q", *SUITE, "--difftest-backends=torch")
    result.stdout.fnmatch_lines(["difftest::suite[[]torch::all-padding]",
                                 "difftest::suite[[]torch::block-boundaries]",
                                 "difftest::suite[[]torch::deepseek-heads]", "14 tests collected*"])


def test_without_the_flag_there_is_no_suite(pytester: pytest.Pytester) -> None:
    assert pytester.runpytest_inprocess("--difftest-backends=torch").ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_the_summary_has_the_headline_per_backend(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(*SUITE, "--difftest-backends=torch", "-k", "length-one or block-boundaries")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*= difftest =*", "backend *cases *rows *-inf-mask mismatch*",
                                 "torch *2 *14 *0/14 *0 *n/a *PASS", "torch: 0/14 rows with the wrong -inf mask",
                                 "--difftest-seed=4000 (the seed of difftest_case and --difftest-suite)"])


def test_a_planted_off_by_one_fails_with_the_row_table(planted: pytest.Pytester) -> None:
    result = planted.runpytest_inprocess(*SUITE, "--difftest-backends=torch,planted:off_by_one", "-k", "length-one")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "_* difftest::suite[[]off-by-one::length-one] _*",
        "off-by-one on length-one-s5000 [[]B=2 next_n=1 *L=[[]1, 1]]: FAIL(mask) (encoding per-row)",
        "    2/2 rows with the wrong -inf mask [[]0,1]; NaN rows none; unwritten rows none; value rows none",
        "    first mismatch: row 0, position 0: expected *, got -inf (FAIL(mask))",
        """    replay: difftest run --backends planted:off_by_one --spec '{"name":"length-one",*}' --seed 5000 """
        "--device cpu *",
        "*= difftest =*",
        "off-by-one: 2/2 rows with the wrong -inf mask",
        "FAILED difftest::suite[[]off-by-one::length-one] - off-by-one on *",
    ])


def test_repro_dir_bundles_and_json_report(planted: pytest.Pytester) -> None:
    result = planted.runpytest_inprocess(*SUITE, "--difftest-backends=torch,planted:off_by_one", "-k", "length-one",
                                         "--difftest-repro-dir=repro", "--difftest-report=out/report.json")
    folder = planted.path / "repro" / "off-by-one--length-one-s5000"
    result.stdout.fnmatch_lines([f"    replay: difftest replay {folder} --trust-bundle",
                                 f"report: {planted.path}/out/report.json"])
    bundle = load_bundle(folder)
    assert (bundle.backend, bundle.origin.target, bundle.verdict) == ("off-by-one", "planted:off_by_one",
                                                                       Verdict.FAIL_MASK)
    try:
        assert cli.main(["replay", str(folder), "--trust-bundle"]) == ExitStatus.FAILED  # it replays the failure
    finally:
        sys.modules.pop("planted", None)  # later pytester runs write their own planted.py
    report = json.loads((planted.path / "out" / "report.json").read_text())
    assert report["run"]["seed"] == 4000
    assert [(r["backend"], r["verdict"]) for r in report["results"]] == [("torch", "PASS"),
                                                                          ("off-by-one", "FAIL(mask)")]
    assert [(s["backend"], s["mask_rows"], s["rows"]) for s in report["summaries"]] == [("torch", 0, 2),
                                                                                       ("off-by-one", 2, 2)]


def test_last_failed_reruns_the_failing_suite_items(planted: pytest.Pytester) -> None:
    # Another seed on the second run, as a run without --difftest-seed gets: the ids carry no seed.
    # all-padding has no window to miss.
    args = ["--difftest-suite", "--difftest-backends=torch,planted:off_by_one", "-k", "length-one or all-padding"]
    planted.runpytest_inprocess(*args, "--difftest-seed=4000").assert_outcomes(passed=3, failed=1)
    result = planted.runpytest_inprocess(*args, "--difftest-seed=123", "--lf")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["run-last-failure: rerun previous 1 failure",
                                 "FAILED difftest::suite[[]off-by-one::length-one] *"])
