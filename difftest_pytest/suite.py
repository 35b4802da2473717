"""`pytest --difftest-suite`: the built-in differential suite as test items, no test file needed.

How: the suite is one Collector whose parent is the Session (node id `difftest`), holding one item
per selected backend x case of --difftest-op's operation (`difftest::suite[torch::block-boundaries]`; under
--difftest-cases envelope, each backend's own cases). SuitePlugin, registered
only with --difftest-suite, collects it through Session.genitems at the start of
pytest_collection_modifyitems (tryfirst), so the collect report, the "collected N items" count,
-k, -m, --deselect, --lf and xdist (every worker draws the same cases from the shared seed) all
see the items as they see a file's. A virtual file or a rootdir sentinel would tie the suite to a
path on disk that the user never wrote.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from difftest.core.kinds import OperationKind
from difftest_pytest.selection import Drawable, Selection, per_backend

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

    from difftest.core.operation import Operation
    from difftest.engine.config import RunConfig
    from difftest.engine.operation_run import Workers

COLLECTOR = "difftest"


class DifftestSuite(pytest.Collector):
    """Every selected backend on every selected case (difftest.generators.cases.suite)."""

    def __init__(self, *, selection: Selection, **kwargs: Any) -> None:
        """A pytest node (from_parent's keywords) over the run's selection."""
        super().__init__(**kwargs)
        self.selection = selection
        self._held = contextlib.ExitStack()  # the operation items' shared workers, closed at teardown
        self._workers: dict[OperationKind, Workers | None] = {}

    def operation_workers(self, op: Operation, config: RunConfig) -> Workers | None:
        """The workers every item of `op` shares (one per backend, each started by its first call), or None
        when the run is not isolated: a worker per item would start a CUDA context and compile the kernel again
        for every case."""
        from difftest.engine.operation_run import operation_workers  # deferred: loads torch

        if op.kind not in self._workers:
            self._workers[op.kind] = self._held.enter_context(operation_workers(op, config))
        return self._workers[op.kind]

    def teardown(self) -> None:
        """Let the workers the items shared exit."""
        self._held.close()

    def collect(self) -> Iterator[SuiteItem | OperationItem]:
        """One item per (backend, case), backend-major (under envelope, each backend's own cases), named
        'suite[backend::case id]' (selection.case_ids: no seed in it)."""
        item = SuiteItem if self.selection.settings.op == OperationKind.PAGED_LOGITS else OperationItem
        for backend_id, drawable, case_id in per_backend(list(self.selection.targets()), self.selection.cases()):
            name = f"suite[{backend_id}::{case_id}]"
            # The node id as a string: parsed, its [...] part becomes the id's params, as in the
            # ids --lf reads back from the cache.
            yield item.from_parent(self, name=name, nodeid=f"{self.nodeid}::{name}", backend_id=backend_id,
                                   drawable=drawable)


class _SuiteNode(pytest.Item):
    """What the suite's items share: a failure shows its assertion's text alone (the row table, or the verdict
    and headline), anything else the usual traceback; the headline names the item under the collector."""

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str | TerminalRepr:
        """The assertion's text alone for a divergence; the usual traceback for anything else."""
        if isinstance(excinfo.value, AssertionError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        """Where the item comes from, as the failure headline shows it."""
        return self.path, None, f"{COLLECTOR}::{self.name}"


class SuiteItem(_SuiteNode):
    """One backend on one case: difftest.check, so a failure is the row table (another operation's: its verdict
    and headline) and its replay line."""

    def __init__(self, *, backend_id: str, drawable: Drawable, **kwargs: Any) -> None:
        """A pytest node (from_parent's keywords) for backend `backend_id` on the case `drawable` draws."""
        super().__init__(**kwargs)
        self.backend_id, self.drawable = backend_id, drawable
        self.add_marker(pytest.mark.difftest)  # `-m difftest` selects the suite

    @property
    def selection(self) -> Selection:
        """The run's backends and cases, held by the parent suite."""
        assert isinstance(self.parent, DifftestSuite)
        return self.parent.selection

    def runtest(self) -> None:
        """Check the backend (skipped with its reason where it cannot run) on the drawn case."""
        from difftest.workflows.checking import check  # deferred: loads torch

        check(self.selection.backend(self.backend_id), self.selection.build(self.drawable))


class OperationItem(SuiteItem):
    """One backend of an operation other than paged logits on one case, through the operation runner
    (difftest.engine.operation_run) with the workers the suite's items share; what it makes of the result is
    check()'s (difftest.workflows.checking.conclude)."""

    def runtest(self) -> None:
        """Run the backend on the drawn case; skip with the reason it could not run."""
        from difftest.engine.config import RunConfig  # deferred: loads torch
        from difftest.engine.operation_run import Named, run_one
        from difftest.workflows.checking import conclude, spec_of

        assert isinstance(self.parent, DifftestSuite)
        backend, op = self.selection.backend(self.backend_id), self.selection.op
        case = self.selection.build(self.drawable)
        config = RunConfig(device=self.selection.settings.device)
        result = run_one(op, Named(self.backend_id, backend.backend), case, config, spec_of(case),
                         workers=self.parent.operation_workers(op, config))
        conclude(backend, case, result, config)


class SuitePlugin:
    """Adds the suite's items to the session; registered only with --difftest-suite."""

    def __init__(self, selection: Selection) -> None:
        self.selection = selection

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        """Collect the suite before deselection and ordering plugins see the item list."""
        suite = DifftestSuite.from_parent(session, name=COLLECTOR, nodeid=COLLECTOR, selection=self.selection)
        items.extend(session.genitems(suite))
