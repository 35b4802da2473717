"""The known-divergence ledger: parsing (every entry cites an issue), matching, xfail and strict XPASS."""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.errors import SpecError
from difftest.ledger import load_ledger
from difftest.result import CaseResult
from difftest.verdict import Verdict

SUITE = ["--difftest-suite", "--difftest-seed=4000", "-k", "length-one", "-rxf"]
ENTRY = """
[[divergence]]
backend = "{backend}"
case = "length-one-*"
reason = "drops the last position of every row"
issue = "example/kernels#12"
"""


def result(backend: str, case: str, spec: dict[str, object] | None = None) -> CaseResult:
    return CaseResult(backend=backend, case=case, description="", rows=2, verdict=Verdict.FAIL_MASK, device="cpu",
                      encoding="per-row", layout="block-split", overridden=False, seconds=0.0, spec=spec)


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
     "divergence[0] keys=['bug']: expected keys among ['backend', 'case', 'reason', 'issue', 'spec']"),
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
    result.stdout.fnmatch_lines(["XFAIL difftest::suite[[]off-by-one::length-one-s5000] - drops the last position "
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
    result.stdout.fnmatch_lines(["FAILED *test_mine[[]block-boundaries-s7000]*"])


def test_a_ledgered_pass_fails_strictly(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", ledger=ENTRY.format(backend="torch"))
    result = pytester.runpytest_inprocess(*SUITE, "--difftest-backends=torch", "--difftest-ledger=ledger.toml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["XPASS(strict): ledger entry torch::length-one-* (example/kernels#12) no longer "
                                 "diverges: torch passes length-one-s5000; remove it from */ledger.toml"])


def test_an_entry_without_an_issue_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", ledger=ENTRY.format(backend="torch").replace('issue = "example/kernels#12"', ""))
    result = pytester.runpytest_inprocess("--difftest-ledger=ledger.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --difftest-ledger=*ledger.toml: divergence[[]0].issue=None: expected the "
                                 "tracking issue: a URL (https://...) or 'owner/repo#N'"])


def test_the_shipped_aiter_ledger_covers_the_edge_suite_exactly(pytester: pytest.Pytester) -> None:
    """ledgers/amd-aiter-*.toml: every edge case the interpreted stage1 kernel fails is an xfail citing
    ROCm/aiter#4290, and the one it passes (all-padding) is not ledgered."""
    from pathlib import Path

    ledger = Path(__file__).parents[2] / "ledgers" / "amd-aiter-0.1.7.post2.dev18.toml"
    result = pytester.runpytest_inprocess("--difftest-suite", "--difftest-cases=edges", "--difftest-seed=0",
                                          "--difftest-backends=aiter-triton-stage1", f"--difftest-ledger={ledger}")
    result.assert_outcomes(passed=1, xfailed=13)
