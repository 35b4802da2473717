"""Results: every check() of a test reaches the item (for the ledger) and its report's user_properties
(so xdist carries it, the GPU it was computed on included, to the controller); the controller sums
them into the `difftest` terminal section and the JSON report."""

from __future__ import annotations

import platform
import shlex
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from difftest import __version__
from difftest.workflows import observe
from difftest_pytest.options import SEED, Settings

if TYPE_CHECKING:
    from difftest.engine.result import CaseResult
    from difftest.records.report import BackendSummary

PROPERTY = "difftest"  # user_properties name of one result, as difftest.core.schema.to_jsonable writes it
RESULTS = pytest.StashKey[list["CaseResult"]]()  # an item's results, in the order its checks ran


def on_controller(config: pytest.Config) -> bool:
    """True unless this process is an xdist worker."""
    return not hasattr(config, "workerinput")


class Recorder:
    """Hears every check() of every test; on the controller, keeps the results of the whole run."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.settings = settings
        self.controller = on_controller(config)
        self.results: list[CaseResult] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        """Run the test with an Observer attached to difftest.check (difftest.workflows.observe)."""
        def record(result: CaseResult) -> None:
            from difftest.core.schema import to_jsonable  # deferred: loads pydantic

            item.stash.setdefault(RESULTS, []).append(result)
            item.user_properties.append((PROPERTY, to_jsonable(result)))

        with observe.observed(observe.Observer(on_result=record, repro_dir=self.settings.repro_dir)):
            return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Gather the results of a finished test (from any xdist worker) on the controller."""
        if report.when == "teardown" and self.controller:
            from difftest.engine.result import CaseResult  # deferred: loads torch

            self.results.extend(CaseResult.from_json(value, "result.") for name, value in report.user_properties
                                if name == PROPERTY)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the JSON report (controller only, empty when nothing was checked) before the summary names it."""
        if self.settings.report is not None and self.controller:
            from difftest.records.report import write_json  # deferred: loads torch

            write_json(self.settings.report, self.results, self.run_info(session.config))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
        """The `difftest` section: the per-backend table, the results per GPU when the workers used
        several, and each backend's -inf-mask headline."""
        if not self.results:
            return
        from difftest.records.report import render_devices, render_table, summarize  # deferred: loads torch

        summaries = summarize(self.results)
        terminalreporter.write_sep("=", "difftest")
        for line in render_table(summaries).splitlines():
            terminalreporter.write_line(line)
        devices = render_devices(self.results)
        if devices:
            terminalreporter.write_line(devices)
        for summary in summaries:
            if summary.cases:
                terminalreporter.write_line(f"{summary.backend}: {summary_headline(summary)}")
        terminalreporter.write_line(f"{SEED}={self.settings.seed} (the seed of difftest_case and --difftest-suite)")
        if self.settings.report is not None:
            terminalreporter.write_line(f"report: {self.settings.report}")

    def run_info(self, config: pytest.Config) -> dict[str, Any]:
        """How the run was made, for the JSON report's `run` field."""
        import torch  # deferred: the plugin loads without torch

        return {"command": shlex.join(["pytest", *config.invocation_params.args]), "seed": self.settings.seed,
                "cases": self.settings.cases_text, "device": self.settings.device,
                "backends": self.settings.backends, "torch": torch.__version__, "difftest": __version__,
                "python": platform.python_version()}



def summary_headline(summary: BackendSummary) -> str:
    """The number a kernel engineer reads first of a backend's results: the rows with the wrong -inf mask of a
    logits stage, the rows selecting a wrong set of a top-k stage (an indexer's: that, its logits stage's
    after)."""
    from difftest.core.kinds import Headline  # deferred: the plugin loads without the library
    from difftest.records.report import headline, headlines  # deferred: the plugin loads without the library

    if Headline.SELECTION not in headlines(summary.operation):
        return headline(summary)
    chosen = f"{summary.set_rows}/{summary.selected_rows} rows select a wrong set ({summary.wrong_tokens} tokens)"
    return chosen if Headline.MASK not in headlines(summary.operation) else f"{chosen}; {headline(summary)}"
