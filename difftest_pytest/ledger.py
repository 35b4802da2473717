"""The known-divergence ledger in pytest: a test whose failing results all have an entry that expects
them is an xfail carrying the reason and the issue; a passing test whose results an entry covers is an
XPASS, which fails only when the entry says `strict = true`. Registered only with --difftest-ledger."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from difftest_pytest.options import LEDGER
from difftest_pytest.results import RESULTS

if TYPE_CHECKING:
    from difftest.engine.result import CaseResult
    from difftest.records.ledger import Divergence, Ledger


def load(path: Path) -> Ledger:
    """The ledger at `path`; a missing file, bad TOML or an entry without an issue is a UsageError."""
    from difftest.core.errors import SpecError  # deferred: with the ledger, which loads torch
    from difftest.records.ledger import load_ledger

    try:
        return load_ledger(path)
    except SpecError as exc:
        raise pytest.UsageError(f"{LEDGER}={path}: {exc}") from None


class LedgerPlugin:
    """Applies one ledger to the call phase of every test that checked a result."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Turn an expected failure into xfail and a covered pass into XPASS, strict or not (not under --runxfail)."""
        report = yield
        results = item.stash.get(RESULTS, [])
        if call.when != "call" or not results or item.config.option.runxfail:
            return report
        if report.failed:
            self._expected_failure(report, results)
        elif report.passed:
            self._covered_pass(report, results)
        return report

    def _expected_failure(self, report: pytest.TestReport, results: list[CaseResult]) -> None:
        failing = [r for r in results if r.verdict.failed]
        entries = [self.ledger.find(r) for r in failing]
        if failing and all(entries):
            report.outcome = "skipped"
            report.wasxfail = _reasons(e for e in entries if e)

    def _covered_pass(self, report: pytest.TestReport, results: list[CaseResult]) -> None:
        strict = [(r, e) for r in results if (e := self.ledger.strict_pass(r))]
        if strict:
            report.outcome = "failed"
            report.longrepr = "\n".join(
                f"XPASS(strict): ledger entry {entry.describe()} no longer diverges: {result.backend} "
                f"passes {result.case}; remove it from {self.ledger.path}" for result, entry in strict)
            return
        covering = [e for r in results if not r.verdict.failed and (e := self.ledger.find(r))]  # find: None for SKIP
        if covering:
            report.wasxfail = _reasons(covering)  # pytest's XPASS: passed although an entry covers it


def _reasons(entries: Iterable[Divergence]) -> str:
    """'reason (issue)' of each distinct entry, as the xfail line shows them."""
    return "; ".join(sorted({f"{e.reason} ({e.issue})" for e in entries}))
