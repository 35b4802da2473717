"""Where a workflow's results go: one list of output writers that `difftest run` and `difftest fuzz` (paged
logits and every other operation alike) hand their results to, instead of each wiring every format by hand.

A writer takes each result the moment it is made, with its case where the workflow has it (take), and
the whole run once it is over (finish); close releases it without finishing (a run that is stopped).
The writers: the JSONL stream (every result as it is made: a killed run keeps them), reproducer bundles
(one per failing result, with the case's tensors), the JSON report and JUnit XML (both written whole at
the end). Outputs is the list a workflow builds from its options; a format added here (one class with
take, finish and close) reaches every workflow that lists it. A run stopped half-way (Ctrl-C, or the
SIGTERM the shells turn into one) keeps what finished the one way every workflow shares (Outputs.stopped,
Outputs.keeping).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from difftest.backends import Loaded, Origin
from difftest.core.errors import Interrupted, OutputError, SpecError, require
from difftest.core.files import OutputLock, check_writable, holds_output
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.records import junit
from difftest.records.bundle import write_bundle
from difftest.records.report import write_json
from difftest.records.serialize import ResultStream, load_results

# A campaign's stream is written in batches this far apart (at most this much of it lost if it is killed): one
# making hundreds of results a second would otherwise spend its time in fsync.
CAMPAIGN_FLUSH_SECONDS = 1.0


class Output(Protocol):
    """One place results go."""

    field: str  # the parameter that named it: errors name it

    def take(self, result: CaseResult, case: Any) -> None:
        """`result`, the moment it is made (`case`: its case, a paged Case or another operation's own, where the
        workflow has it; None where it has not)."""

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

    def take(self, result: CaseResult, case: Any) -> None:
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

    def take(self, result: CaseResult, case: Any) -> None:
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

    def take(self, result: CaseResult, case: Any) -> None:
        """Nothing: the XML is written once, at the end."""

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path:
        made = junit.suite(self.suite, list(results), self.known)
        return junit.write(self.path, [made], field=self.field)

    def close(self) -> None:
        """Nothing to release."""


class BundleOutput:
    """A reproducer bundle (difftest.records.bundle) under `directory` for every failing result whose case
    the workflow hands over, written the moment the result is made; `write` bundles one on demand.

    A result's backend is looked up in `backends` (the paged workflows': what loads it again, what it loaded);
    one not among them is a registered backend of its operation (another operation's backends are built from
    its table by name), its library the one its result records. With `first_of`, only the first failing result
    of each key it gives is bundled (a campaign repeats a failure thousands of times: one reproducer of each is
    what a reader replays and shrinks)."""

    def __init__(self, directory: Path, config: RunConfig, backends: Iterable[Loaded] = (),
                 first_of: Callable[[CaseResult], Hashable] | None = None, field: str = "repro_dir") -> None:
        self.directory, self.config, self.first_of, self.field = directory, config, first_of, field
        self.backends = {b.name: b for b in backends}
        self.written: list[Path] = []
        self.seen: set[Hashable] = set()

    def take(self, result: CaseResult, case: Any) -> None:
        if result.verdict.failed and case is not None and self._first(result):
            self.write(case, result)

    def _first(self, result: CaseResult) -> bool:
        """Whether `result` is the first of its key (every result is, without `first_of`)."""
        if self.first_of is None:
            return True
        key = self.first_of(result)
        fresh = key not in self.seen
        self.seen.add(key)
        return fresh

    def write(self, case: Any, result: CaseResult) -> Path:
        """The bundle of `result` on `case`: its folder."""
        loaded = self.backends.get(result.backend)
        origin = loaded.origin if loaded else Origin(result.backend, registered=True)
        library = loaded.contract.library if loaded else result.library
        folder = write_bundle(self.directory, case, result, self.config, origin, library, field=self.field)
        self.written.append(folder)
        return folder

    def finish(self, results: Sequence[CaseResult], info: Mapping[str, Any]) -> Path | None:
        return self.directory if self.written else None

    def close(self) -> None:
        """Nothing to release: each bundle is whole once written."""


def check_outputs(files: Mapping[str, Path | None], repro_dir: Path | None = None) -> None:
    """Before a workflow runs its first case: OutputError naming the first parameter (of `files`, by parameter,
    and `repro_dir`, a folder) that cannot be written, so that a path that cannot be written is one error, not
    a run's work lost at its end."""
    for field, path in files.items():
        if path is not None:
            check_writable(path, field)
    if repro_dir is not None:
        check_writable(repro_dir, "repro_dir", folder=True)


def stream_beside(report: Path | None, stream: Path | None) -> Path | None:
    """Where a run's results stream: `stream`, else beside `report` (its suffix .jsonl), else nowhere."""
    return stream or (report.with_suffix(".jsonl") if report else None)


def run_files(report: Path | None, stream: Path | None, stream_given: bool) -> dict[Path, str]:
    """The files a run writes as it goes, resolved, each with the parameter that named it: the report, and the
    stream (beside the report unless `stream_given`: then the report's parameter names it too)."""
    files: dict[Path, str] = {}
    for field, path in (("report", report), ("stream" if stream_given else "report", stream)):
        if path is not None:
            files.setdefault(path.resolve(), field)
    return files


def claimed(files: Mapping[Path, str], overwrite: bool, resumable: bool = False) -> list[OutputLock]:
    """Before a run's first case: each of `files` (a resolved path and the parameter that named it, run_files)
    writable (OutputError naming the parameter) and locked for this run (OutputError naming the run that holds
    one), and none holding an earlier run's output unless `overwrite` says so (SpecError, offering a resume where
    the workflow can resume): a run never replaces another's results unasked. The caller releases the locks once
    its outputs are written."""
    remedy = "overwrite it, or resume from it" if resumable else "overwrite it"
    for path, field in files.items():
        check_writable(path, field)
    locks: list[OutputLock] = []
    try:
        for path, field in files.items():
            locks.append(OutputLock(path, field).acquire())
        for path, field in files.items():  # an empty file is no earlier run's: `mktemp` made it for this one
            require(overwrite or not holds_output(path), field, str(path),
                    f"a path no earlier run wrote (one did: {remedy})")
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


class Outputs:
    """A workflow's writers, in one list: each result goes to every one of them."""

    def __init__(self, writers: Iterable[Output | None] = ()) -> None:
        self.writers: list[Output] = [w for w in writers if w is not None]

    def of(self, kind: type[Any]) -> Any:
        """The writer of type `kind`, or None."""
        return next((w for w in self.writers if isinstance(w, kind)), None)

    def take(self, result: CaseResult, case: Any = None) -> None:
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

    def so_far(self, finished: Sequence[CaseResult]) -> list[CaseResult]:
        """What a run stopped half-way keeps: what its stream holds, the record (a stop may fall between a
        result's line and its workflow's list; a resumed run's stream starts with what it resumes), else, with
        no stream or one that cannot be read back, `finished`."""
        stream = self.of(StreamOutput)
        if stream is not None:
            with contextlib.suppress(SpecError, OSError):
                return load_results(stream.path, stream.field)
        return list(finished)

    def stopped(self, finished: Sequence[CaseResult], info: Mapping[str, Any], resumable: bool = True,
                streamed: Path | None = None) -> Interrupted:
        """A run stopped by Ctrl-C (or the SIGTERM the shells turn into one): every writer released, then
        finished with what the run kept (so_far), `info` marked incomplete; the Interrupted that says how many
        results and where they are (the stream, or `streamed`, one the workflow wrote itself, and the report)."""
        self.close()
        kept = self.so_far(finished)
        self.finish(kept, {**info, "incomplete": True})
        files = [w.path for w in self.writers if isinstance(w, (StreamOutput, ReportOutput))]
        where = [streamed] if streamed is not None else []
        return Interrupted(len(kept), tuple(str(p) for p in where + files), resumable)

    @contextlib.contextmanager
    def keeping(self, finished: Sequence[CaseResult], info: Callable[[], Mapping[str, Any]],
                resumable: bool = True) -> Iterator[None]:
        """The run in the block, its writers released when it ends. Stopped inside it by Ctrl-C or SIGTERM: the
        Interrupted of stopped() (`finished`: the list the run adds its results to; `info`: how it was made,
        asked for when it stops). An output that can no longer be written (a full disk: OutputError): the
        others still get what finished, marked incomplete, and the error goes on."""
        try:
            yield
        except KeyboardInterrupt:
            raise self.stopped(finished, info(), resumable) from None
        except OutputError:
            self.close()
            with contextlib.suppress(OutputError):
                self.finish(self.so_far(finished), {**info(), "incomplete": True})
            raise
        finally:
            self.close()
