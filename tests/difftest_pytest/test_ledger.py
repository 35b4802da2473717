"""The known-divergence ledger: parsing (every entry cites an issue), matching on patterns, verdicts and
ranges, xfail, XPASS and strict XPASS."""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.core.errors import SpecError
from difftest.core.verdict import Verdict
from difftest.engine.result import CaseResult
from difftest.records.ledger import load_ledger

SUITE = ["--difftest-suite", "--difftest-seed=4000", "-k", "length-one", "-rxf"]
ENTRY = """
[[divergence]]
backend = "{backend}"
case = "length-one-*"
reason = "drops the last position of every row"
issue = "example/kernels#12"
"""


def result(backend: str, case: str, spec: dict[str, object] | None = None,
           verdict: Verdict = Verdict.FAIL_MASK) -> CaseResult:
    return CaseResult(backend=backend, case=case, description="", rows=2, verdict=verdict, device="cpu",
                      encoding="per-row", layout="block-split", overridden=False, seconds=0.0, spec=spec)


RANGED = """
[[divergence]]
backend = "aiter-*"
verdict = "FAIL(mask)"
spec = { next_n = { min = 2 }, lengths = { min = 100, max = 200 }, block_size = 64 }
strict = true
reason = "mirrored window past 100 tokens"
issue = "example/kernels#13"

[[divergence]]
backend = "aiter-*"
verdict = ["FAIL(value)", "FAIL(nan)"]
spec = { max_model_len = { max = 64 } }
reason = "short contexts"
issue = "example/kernels#14"
"""
MTP2 = {"next_n": 2, "lengths": [5, 150], "block_size": 64, "max_model_len": 256}


def test_entries_match_on_verdicts_and_ranges(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(RANGED)
    mtp, short = load_ledger(path).entries
    assert mtp.expects(result("aiter-a", "x-s1", MTP2)) and mtp.strict and not short.strict
    assert not mtp.expects(result("aiter-a", "x-s1", MTP2, Verdict.FAIL_NAN))  # a NaN is a new bug
    assert not mtp.covers(result("aiter-a", "x-s1", {**MTP2, "next_n": 1}))
    assert not mtp.covers(result("aiter-a", "x-s1", {**MTP2, "lengths": [5, 99]}))  # no length in [100, 200]
    assert not mtp.covers(result("aiter-a", "x-s1", {**MTP2, "lengths": None}))  # lengths drawn, not listed
    assert not mtp.covers(result("aiter-a", "x-s1", {**MTP2, "block_size": 16}))
    assert short.expects(result("aiter-a", "x-s1", {"max_model_len": 64}, Verdict.FAIL_NAN))
    assert not short.expects(result("aiter-a", "x-s1", {"max_model_len": 64}))  # FAIL(mask) is not foreseen
    assert mtp.describe() == "aiter-*::* FAIL(mask) (example/kernels#13)"


def test_only_a_strict_entry_makes_a_covered_pass_unexpected(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(RANGED)
    ledger = load_ledger(path)
    strict_pass = result("aiter-a", "x-s1", MTP2, Verdict.PASS)
    loose_pass = result("aiter-a", "x-s1", {"max_model_len": 64}, Verdict.PASS)
    nan = result("aiter-a", "x-s1", MTP2, Verdict.FAIL_NAN)
    expected = result("aiter-a", "x-s1", MTP2)
    assert ledger.strict_pass(strict_pass) is ledger.entries[0] and ledger.strict_pass(loose_pass) is None
    assert ledger.unexpected([strict_pass, loose_pass, nan, expected]) == [strict_pass, nan]


def test_entries_match_backend_and_case_patterns_and_spec_fields(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(ENTRY.format(backend="aiter-*") + """
[[divergence]]
backend = "deepgemm"
case = "*"
spec = { next_n = 4, length_dist = "edg*" }
reason = "next_n = 4 schedule"
issue = "https://github.com/deepseek-ai/DeepGEMM/issues/353"
""")
    ledger = load_ledger(path)
    assert [entry.describe() for entry in ledger.entries] == [
        "aiter-*::length-one-* (example/kernels#12)",
        "deepgemm::* (https://github.com/deepseek-ai/DeepGEMM/issues/353)"]
    assert ledger.find(result("aiter-triton-fused", "length-one-s5")) is ledger.entries[0]
    assert ledger.find(result("torch", "length-one-s5")) is None
    assert ledger.find(result("deepgemm", "random-s1", {"next_n": 4, "length_dist": "edges"})) is ledger.entries[1]
    assert ledger.find(result("deepgemm", "random-s1", {"next_n": 2, "length_dist": "edges"})) is None
    assert ledger.find(result("deepgemm", "hand-built")) is None  # no spec to match the fields against


@pytest.mark.parametrize(("text", "message"), [
    ('[[divergence]]\nbackend = "x"\ncase = "*"\nreason = "r"\n',
     "divergence[0].issue=None: expected the tracking issue: a URL (https://...) or 'owner/repo#N'"),
    ('[[divergence]]\nbackend = "x"\ncase = "*"\nreason = "r"\nissue = "soon"\n',
     "divergence[0].issue='soon': expected the tracking issue: a URL (https://...) or 'owner/repo#N'"),
    ('[[divergence]]\nbackend = "x"\ncase = "*"\nreason = "r"\nissue = "a/b#1"\nbug = 1\n',
     "divergence[0] keys=['bug']: expected keys among ['backend', 'case', 'verdict', 'spec', 'strict', 'reason', "
     "'issue']"),
    ('[[divergence]]\nbackend = "x"\nreason = "r"\nissue = "a/b#1"\nverdict = "PASS"\n',
     "divergence[0].verdict='PASS': expected a failing verdict, or a list of them, among ['CRASH', "),
    ('[[divergence]]\nbackend = "x"\nreason = "r"\nissue = "a/b#1"\nspec = { next_n = { min = 3, max = 2 } }\n',
     "divergence[0].spec.next_n={'min': 3, 'max': 2}: expected an fnmatch pattern (a string), an integer in "
     "[1, 16], or a range { min = A, max = B } (either may be left out) of those"),
    ('[[divergence]]\nbackend = "x"\nreason = "r"\nissue = "a/b#1"\nspec = { lengths = { least = 3 } }\n',
     "divergence[0].spec.lengths={'least': 3}: expected an fnmatch pattern (a string), a list of lengths, or a "
     "range"),
    ('[[divergence]]\nbackend = "x"\nreason = "r"\nissue = "a/b#1"\nstrict = "yes"\n',
     "divergence[0].strict='yes': expected true or false"),
    ('[[divergence]]\nbackend = "x"\ncase = "*"\nreason = "r"\nissue = "a/b#1"\nspec = { nextn = 2 }\n',
     "divergence[0].spec=['nextn']: expected CaseSpec fields among ["),
    ("[[divergence]\n", "expected valid TOML"),
])
def test_a_bad_entry_names_its_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as excinfo:
        load_ledger(path)
    assert message in str(excinfo.value)


def test_a_ledgered_divergence_is_an_xfail_with_reason_and_issue(planted: pytest.Pytester) -> None:
    planted.makefile(".toml", ledger=ENTRY.format(backend="off-by-one"))
    result = planted.runpytest_inprocess(*SUITE, "--difftest-backends=planted:off_by_one",
                                         "--difftest-ledger=ledger.toml")
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(["XFAIL difftest::suite[[]off-by-one::length-one] - drops the last position "
                                 "of every row (example/kernels#12)"])


def test_a_ledgered_check_in_a_user_test_is_an_xfail_too(planted: pytest.Pytester) -> None:
    planted.makefile(".toml", ledger=ENTRY.format(backend="off-by-one"))
    planted.makepyfile("""
        import difftest
        import planted

        def test_mine(difftest_case):
            difftest.check(planted.off_by_one, difftest_case)
    """)
    result = planted.runpytest_inprocess("--difftest-seed=4000", "-k", "length-one or block-boundaries",
                                         "--difftest-ledger=ledger.toml")
    result.assert_outcomes(xfailed=1, failed=1)  # block-boundaries diverges too, but no entry covers it
    result.stdout.fnmatch_lines(["FAILED *test_mine[[]block-boundaries]*"])


def test_a_pass_a_strict_entry_covers_fails(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", ledger=ENTRY.format(backend="torch") + "strict = true\n")
    result = pytester.runpytest_inprocess(*SUITE, "--difftest-backends=torch", "--difftest-ledger=ledger.toml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["XPASS(strict): ledger entry torch::length-one-* (example/kernels#12) no longer "
                                 "diverges: torch passes length-one-s5000; remove it from */ledger.toml"])


def test_a_pass_a_loose_entry_covers_is_an_xpass(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", ledger=ENTRY.format(backend="torch"))
    result = pytester.runpytest_inprocess(*SUITE, "--difftest-backends=torch", "--difftest-ledger=ledger.toml")
    result.assert_outcomes(xpassed=1)


def test_a_failure_with_another_verdict_is_not_ledgered(planted: pytest.Pytester) -> None:
    planted.makefile(".toml", ledger=ENTRY.format(backend="off-by-one") + 'verdict = "FAIL(nan)"\n')
    result = planted.runpytest_inprocess(*SUITE, "--difftest-backends=planted:off_by_one",
                                         "--difftest-ledger=ledger.toml")
    result.assert_outcomes(failed=1)


def test_an_entry_without_an_issue_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", ledger=ENTRY.format(backend="torch").replace('issue = "example/kernels#12"', ""))
    result = pytester.runpytest_inprocess("--difftest-ledger=ledger.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --difftest-ledger=*ledger.toml: divergence[[]0].issue=None: expected the "
                                 "tracking issue: a URL (https://...) or 'owner/repo#N'"])


def test_the_shipped_aiter_ledger_covers_the_edge_suite(pytester: pytest.Pytester) -> None:
    """difftest/ledgers/amd-aiter-*.toml: every edge case the interpreted stage1 kernel fails is an xfail citing
    ROCm/aiter#4290, and the one it passes (all-padding) an XPASS of its loose entry."""
    from pathlib import Path

    ledger = Path(__file__).parents[2] / "difftest" / "ledgers" / "amd-aiter-0.1.7.post2.dev18.toml"
    result = pytester.runpytest_inprocess("--difftest-suite", "--difftest-cases=edges", "--difftest-seed=0",
                                          "--difftest-backends=aiter-triton-stage1", f"--difftest-ledger={ledger}")
    result.assert_outcomes(xpassed=1, xfailed=13)
