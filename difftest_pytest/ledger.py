"""The known-divergence ledger in pytest: a test whose failing results all match ledger entries is
an xfail carrying the reason and the issue; a test whose passing result matches an entry fails,
strictly, until the entry is removed. Registered only with --difftest-ledger."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from difftest_pytest.options import LEDGER
from difftest_pytest.results import RESULTS

if TYPE_CHECKING:
    from difftest.ledger import Ledger


def load(path: Path) -> Ledger:
    """The ledger at `path`; a missing file, bad TOML or an entry without an issue is a UsageError."""
    from difftest.errors import SpecError  # deferred: with the ledger, which loads torch
    from difftest.ledger import load_ledger

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
        """Turn a ledgered failure into xfail and a ledgered pass into a strict failure (not under --runxfail)."""
        report = yield
        results = item.stash.get(RESULTS, [])
        if call.when != "call" or not results or item.config.option.runxfail:
            return report
        failing = [r for r in results if r.verdict.failed]
        entries = [self.ledger.find(r) for r in failing]
        if report.failed and failing and all(entries):
            report.outcome = "skipped"
            report.wasxfail = "; ".join(sorted({f"{e.reason} ({e.issue})" for e in entries if e}))
            return report
        if report.passed:
            fixed = [(r, e) for r in results if r.verdict.value == "PASS" and (e := self.ledger.find(r))]
            if fixed:
                report.outcome = "failed"
                report.longrepr = "\n".join(
                    f"XPASS(strict): ledger entry {entry.describe()} no longer diverges: {result.backend} "
                    f"passes {result.case}; remove it from {self.ledger.path}" for result, entry in fixed)
        return report
