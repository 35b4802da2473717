"""Where a workflow's results go: one list of output writers that `difftest run` and `difftest fuzz` hand
their results to, instead of each wiring every format by hand.

A writer takes each result the moment it is made, with its case where the workflow has it (take), and
the whole run once it is over (finish); close releases it without finishing (a run that is stopped).
The writers: the JSONL stream (every result as it is made: a killed run keeps them), reproducer bundles
(one per failing result, with the case's tensors), the JSON report and JUnit XML (both written whole at
the end). Outputs is the list a workflow builds from its options; a format added here (one class with
take, finish and close) reaches every workflow that lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from difftest.backends import Loaded
from difftest.core.case import Case
from difftest.core.errors import OutputError
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.records import junit
from difftest.records.bundle import write_bundle
from difftest.records.report import write_json
from difftest.records.serialize import ResultStream


class Output(Protocol):
    """One place results go."""

    field: str  # the parameter that named it: errors name it

    def take(self, result: CaseResult, case: Case | None) -> None:
        """`result`, the moment it is made (`case`: its case, where the workflow has it)."""

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path | None:
        """Every result of the run and how it was made, once it is over: the file written, if any."""

    def close(self) -> None:
        """Release what it holds without finishing (a run stopped half-way); harmless after finish."""


class StreamOutput:
    """The JSONL stream (difftest.records.serialize.ResultStream): a {"run": info} line when `info` is
    given, the `kept` results (those a resumed run keeps, so that every stream holds its whole run), then
    each result as it is made, written in batches `flush_seconds` apart (0: each at once)."""

    def __init__(self, path: Path, info: Mapping[str, Any] | None = None, kept: Iterable[CaseResult] = (),
                 append: bool = False, flush_seconds: float = 0.0, field: str = "stream") -> None:
        self.path, self.field = path, field
        self.stream = ResultStream(path, append=append, field=field, flush_seconds=flush_seconds)
        if info is not None:
            self.stream.header(dict(info))
        for result in kept:
            self.stream.write(result)

    def take(self, result: CaseResult, case: Case | None) -> None:
        self.stream.write(result)

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path:
        self.stream.close()
        return self.path

    def close(self) -> None:
        self.stream.close()


class ReportOutput:
    """The JSON report (difftest.records.report.write_json), written whole and atomically at the end."""

    def __init__(self, path: Path, field: str = "report") -> None:
        self.path, self.field = path, field

    def take(self, result: CaseResult, case: Case | None) -> None:
        """Nothing: the report is written once, at the end."""

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path:
        return write_json(self.path, list(results), dict(info))

    def close(self) -> None:
        """Nothing to release."""


class JUnitOutput:
    """JUnit XML (difftest.records.junit): one testsuite called `suite` of every result, written at the end;
    `known` reads a known divergence (a ledger's) as skipped."""

    def __init__(self, path: Path, suite: str, known: junit.Known | None = None, field: str = "junit") -> None:
        self.path, self.suite, self.known, self.field = path, suite, known, field

    def take(self, result: CaseResult, case: Case | None) -> None:
        """Nothing: the XML is written once, at the end."""

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path:
        made = junit.suite(self.suite, list(results), self.known)
        return junit.write(self.path, [made], field=self.field)

    def close(self) -> None:
        """Nothing to release."""


class BundleOutput:
    """A reproducer bundle (difftest.records.bundle) under `directory` for every failing result whose case
    the workflow hands over, written the moment the result is made; `write` bundles one on demand."""

    def __init__(self, directory: Path, config: RunConfig, backends: Iterable[Loaded],
                 field: str = "repro_dir") -> None:
        self.directory, self.config, self.field = directory, config, field
        self.backends = {b.name: b for b in backends}
        self.written: list[Path] = []

    def take(self, result: CaseResult, case: Case | None) -> None:
        if result.verdict.failed and case is not None:
            self.write(case, result)

    def write(self, case: Case, result: CaseResult) -> Path:
        """The bundle of `result` on `case`: its folder."""
        backend = self.backends[result.backend]
        folder = write_bundle(self.directory, case, result, self.config, backend.origin, backend.contract.library,
                              field=self.field)
        self.written.append(folder)
        return folder

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path | None:
        return self.directory if self.written else None

    def close(self) -> None:
        """Nothing to release: each bundle is whole once written."""


class Outputs:
    """A workflow's writers, in one list: each result goes to every one of them."""

    def __init__(self, writers: Iterable[Output | None] = ()) -> None:
        self.writers: list[Output] = [w for w in writers if w is not None]

    def of(self, kind: type[Any]) -> Any:
        """The writer of type `kind`, or None."""
        return next((w for w in self.writers if isinstance(w, kind)), None)

    def take(self, result: CaseResult, case: Case | None = None) -> None:
        """`result` (and its case) to every writer."""
        for writer in self.writers:
            writer.take(result, case)

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> dict[str, Path]:
        """Every writer finished with the whole run, each given its chance even when one before it could
        not write (the first such OutputError is raised after the rest): what each wrote, by field."""
        written: dict[str, Path] = {}
        failed: OutputError | None = None
        for writer in self.writers:
            try:
                path = writer.finish(results, info)
            except OutputError as exc:
                failed = failed or exc
                continue
            if path is not None:
                written[writer.field] = path
        if failed is not None:
            raise failed
        return written

    def close(self) -> None:
        """Every writer released, finished or not."""
        for writer in self.writers:
            writer.close()
