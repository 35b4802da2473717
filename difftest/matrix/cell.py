"""`difftest matrix plan` and `difftest matrix run CELL`: a matrix file planned with the backends'
contracts, and one cell of it run here, its JSON report and JUnit file written.

Before a cell runs, its library version is put in place: a path version's folder goes first on
sys.path (for this process) and first on PYTHONPATH (for every worker and child process the run
starts), so `import aiter` or `import deep_gemm` resolve there; a wheel version must be the one
installed (the CI job pip-installs it). That happens before any backend is loaded, since backends
cache the library they find. A GPU cell checks that it landed on its kind of GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from difftest.backends import get_backends
from difftest.core import hardware
from difftest.core.errors import require
from difftest.core.hardware import DeviceKind
from difftest.core.kinds import OperationKind
from difftest.core.spec import CaseSpec
from difftest.engine.config import RunConfig
from difftest.engine.plan import SuiteRequest
from difftest.engine.result import CaseResult
from difftest.matrix.definition import Cell, Matrix, MatrixPlan, Source, Version, load_matrix, plan
from difftest.matrix.emit import CELLS_DIR
from difftest.operations import operation
from difftest.records import junit
from difftest.records.ledger import load_ledger
from difftest.records.report import write_json
from difftest.records.score import SelftestScore
from difftest.workflows import fuzz, selftest, session
from difftest.workflows.operation_session import (
    OperationCampaign,
    OperationRequest,
    execute_operation,
    fuzz_operation,
)

REPORT = "report.json"
JUNIT = "junit.xml"


@dataclasses.dataclass(frozen=True)
class CellRun:
    """What one cell made: its results, and where its report (whose run's `matrix` names the cell) and
    JUnit file went."""

    cell: Cell
    results: list[CaseResult]
    report: Path
    junit: Path


def plan_matrix(matrix: Matrix) -> MatrixPlan:
    """The cells of `matrix`, each backend's devices and archs read from its contract. A name that is a
    backend of the operation a suite runs (other than paged logits) is that operation's; every other name
    is a paged-logits backend of the registry."""
    tables = {suite.op: operation(suite.op).backends() for suite in matrix.suites
              if suite.op != OperationKind.PAGED_LOGITS}
    operations = {name: kind for kind, table in tables.items() for name in matrix.backends if name in table}
    paged = [name for name in matrix.backends if name not in operations]
    loaded = get_backends(paged, field=f"{matrix.path} matrix.backends") if paged else []
    contracts = {name: backend.contract for name, backend in zip(paged, loaded, strict=True)}
    contracts |= {name: tables[kind][name]().contract for name, kind in operations.items()}
    return plan(matrix, contracts, operations)


def run_cell(file: str | Path | None, name: str, out: str | Path | None = None) -> CellRun:
    """Run the cell `name` of the matrix in `file` (None: the one in the working folder) here; its
    report.json and junit.xml go under `out` (default: difftest-matrix/<the cell's CI id>)."""
    matrix = load_matrix(file)
    version = next((v for v in matrix.versions if name.split("/")[1:2] == [v.name]), None)
    with version_in_place(matrix, version):
        cell = plan_matrix(matrix).cell(name)
        _check_machine(cell)
        out = Path(out) if out is not None else Path(CELLS_DIR) / cell.slug
        results, info = _run_suite(cell, out)
        scored = _selftest(cell) if cell.suite.selftest else None
    info = {**info, "matrix": {"cell": cell.name, "device": cell.runner.kind.value, "version": cell.version.name,
                               "library": cell.version.describe(), "suite": cell.suite.name}}
    ledger = load_ledger(matrix.resolve(matrix.ledger)) if matrix.ledger else None
    report = write_json(out / REPORT, results, info, scored)
    suite = junit.suite(cell.name, results, ledger.known if ledger is not None else None)
    written = junit.write(out / JUNIT, [suite], field="out")
    return CellRun(cell, results, report, written)


@contextlib.contextmanager
def version_in_place(matrix: Matrix, version: Version | None) -> Iterator[None]:
    """Within: a path version's folder first on sys.path and PYTHONPATH (both restored after), or
    the installed distribution checked against a wheel version. Nothing for the installed one."""
    if version is None or version.source == Source.INSTALLED or version.target is None:
        yield
        return
    if version.source == Source.WHEEL:
        _check_wheel(matrix, version)
        yield
        return
    folder = matrix.resolve(version.target).resolve()
    require(folder.is_dir(), f"{matrix.path} matrix.versions.{version.name}.path", version.target,
            f"an existing folder, relative to {matrix.path.parent.resolve()}")
    saved_path, saved_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *([saved_env] if saved_env else [])])
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_env


def _check_wheel(matrix: Matrix, version: Version) -> None:
    """SpecError unless the installed distribution is the version's pinned one."""
    from packaging.requirements import Requirement  # deferred: an optional dependency (difftest[matrix])

    wanted = Requirement(version.target or "")
    try:
        installed: str | None = importlib.metadata.version(wanted.name)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    require(installed is not None and wanted.specifier.contains(installed, prereleases=True),
            f"{matrix.path} matrix.versions.{version.name}.wheel", version.target,
            f"the installed distribution ({wanted.name} {installed or 'is not installed'}; "
            f"pip install '{version.target}' first)")


def _check_machine(cell: Cell) -> None:
    """A GPU cell runs on its kind of GPU: an sm100 cell on an sm90 runner would test the wrong thing."""
    kind = cell.runner.kind
    if kind is DeviceKind.CPU:
        return
    reason = hardware.cuda_unavailable_reason()
    require(reason is None, "cell", cell.name, f"a {kind.value} GPU ({reason})")
    require(hardware.arch() == kind.arch, "cell", cell.name, f"a {kind.value} GPU, this one is {hardware.arch()}")


def _selftest(cell: Cell) -> SelftestScore:
    """The report's `selftest` section: the mutants scored in the envelope of the cell's first backend, under
    the cell's device and isolation, their plan narrowed by the suite's case_filter (their results stay out of
    the cell's: the mutants are meant to fail)."""
    config = RunConfig(device=cell.runner.kind.device, isolate=cell.suite.isolate, repeat=2)
    outcome = selftest.selftest(selftest.SelftestRequest(config=config, template=cell.backends[0],
                                                         seed=cell.suite.seed, case_filter=cell.suite.case_filter))
    return selftest.score_section(outcome)


def _run_suite(cell: Cell, out: Path) -> tuple[list[CaseResult], dict[str, Any]]:
    """The cell's suite through `difftest run` (or `fuzz`): its results and the run's info."""
    suite, argv = cell.suite, ("matrix", "run", cell.name)
    config = RunConfig(device=cell.runner.kind.device, isolate=suite.isolate)
    stream = out / "report.jsonl"
    if suite.op != OperationKind.PAGED_LOGITS:
        return _run_operation_suite(cell, config, stream, argv)
    if suite.fuzz:
        assert suite.budget is not None, "the schema requires a fuzz suite's budget"
        campaign = fuzz.Campaign(budget=suite.budget, backends=cell.backends, config=config, seed=suite.seed,
                                 stream=stream, shrink_seconds=0)
        found = fuzz.fuzz(campaign)
        return found.results, {"command": "difftest " + " ".join(argv), "seed": suite.seed, "device": config.device,
                               "budget": suite.budget}
    request = session.RunRequest(
        suite=SuiteRequest(cases=suite.cases, count=suite.count, seed=suite.seed, case_filter=suite.case_filter,
                           spec=CaseSpec.from_json(suite.spec) if suite.spec is not None else None),
        backends=cell.backends, config=config, stream=stream, budget=suite.budget, argv=argv, overwrite=True)
    outcome = session.execute(request)
    return outcome.results, outcome.info


def _run_operation_suite(cell: Cell, config: RunConfig, stream: Path, argv: tuple[str, ...]) -> tuple[
        list[CaseResult], dict[str, Any]]:
    """A suite of an operation other than paged logits through `difftest run --op` (or `fuzz --op`)."""
    suite = cell.suite
    if suite.fuzz:
        assert suite.budget is not None, "the schema requires a fuzz suite's budget"
        campaign = OperationCampaign(operation=suite.op, budget=suite.budget, seed=suite.seed, backends=cell.backends,
                                     config=config, argv=argv)
        found = fuzz_operation(campaign)
        return found.results, found.info
    request = OperationRequest(operation=suite.op, cases=suite.cases, seed=suite.seed, count=suite.count or 1,
                               backends=cell.backends, config=config, stream=stream, budget=suite.budget, argv=argv)
    outcome = execute_operation(request)
    return outcome.results, outcome.info
