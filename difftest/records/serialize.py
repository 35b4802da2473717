"""JSON: results as plain JSON and back, and the JSONL stream a run appends to as it goes.

The JSONL stream (ResultStream): one line per result, appended and flushed the moment the result is
made, so a run killed half-way keeps every result it finished. A line is either {"run": {...}}
(written when a run starts or resumes) or {"result": {...}} (to_jsonable of a CaseResult).
load_results reads a stream or a JSON report (difftest.records.report.write_json) back into CaseResults.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import model_validator

from difftest.core.errors import OutputError, SpecError, require
from difftest.core.files import cannot_write, open_regular, regular_target
from difftest.core.schema import Model, parse_json, read_text, to_jsonable, validate
from difftest.engine.result import CaseResult
from difftest.records.report import Report
from difftest.records.run_info import RunInfoModel

MAX_LINE_PEEK = 1 << 20  # is_stream reads this much of the first line at most
STREAM_TEXT = 'a JSON report, or JSONL lines {"run": ...} / {"result": ...}'


class StreamLineModel(Model):
    """One line of a JSONL stream (ResultStream): {"run": ...} or {"result": ...}, the result a CaseResult."""

    what: ClassVar[str] = STREAM_TEXT
    unknown_expected: ClassVar[str | None] = STREAM_TEXT
    run: RunInfoModel | None = None
    result: CaseResult | None = None

    @model_validator(mode="after")
    def _one(self) -> StreamLineModel:
        if (self.run is None) == (self.result is None):
            raise SpecError("", sorted(self.model_fields_set), STREAM_TEXT)
        return self


def load_results(path: str | Path, field: str = "resume") -> list[CaseResult]:
    """Every result of a JSON report (write_json) or of a JSONL stream (ResultStream).

    A stream's last line may be torn (the run was killed while writing it): it is ignored. Each result
    is validated into its CaseResult (a report as a Report, a stream line by StreamLineModel): a
    SpecError names `field`, the bad value, what is allowed and where ('at r.jsonl:3 result.verdict'),
    or why the file cannot be read.
    """
    path = Path(path)
    text = read_text(path, field, "report or stream")
    document = _json_or_none(text)
    # What is neither is refused by its path alone, never quoted: the file may be anything (a secret).
    if isinstance(document, dict) and not _is_record(document):  # one JSON object, not one stream record
        require("results" in document, field, str(path), f"{STREAM_TEXT} (a JSON object with no results is neither)")
    else:  # a stream, unless empty or a first line torn as it was written (no JSON, no newline)
        first = _json_or_none(text.partition("\n")[0])
        require(not text.strip() or _is_record(first) or (first is None and "\n" not in text), field, str(path),
                f"{STREAM_TEXT} (its first line is neither)")
    try:
        if isinstance(document, dict) and not _is_record(document):
            return validate(Report, document, f"{path} ").results
        return _stream_results(text, path)
    except SpecError as exc:  # named after `field` (the option that gave the file), the place in it after
        raise SpecError(field, exc.value, f"{exc.expected}, at {exc.field}") from None


def _is_record(value: Any) -> bool:
    """Whether `value` is one line of a stream: {"run": ...} or {"result": ...}."""
    return isinstance(value, dict) and len(value) == 1 and bool({"run", "result"} & set(value))


def load_run_info(path: str | Path, field: str = "resume") -> list[dict[str, Any]]:
    """How the results of a report or stream were made: a JSON report's `run`, or every {"run": ...}
    line of a stream (one per session: a resumed run adds its own). Read after load_results has
    checked the file; SpecError naming `field` when it cannot be read."""
    text = read_text(path, field, "report or stream")
    document = _json_or_none(text)
    if isinstance(document, dict) and not _is_record(document):
        return [document.get("run") or {}]
    records = (_json_or_none(line) for line in text.splitlines())
    return [record["run"] for record in records if isinstance(record, dict) and isinstance(record.get("run"), dict)]


def is_stream(path: str | Path) -> bool:
    """Whether `path` holds a JSONL stream (its first line a {"run": ...} or {"result": ...} record)."""
    try:
        with Path(path).open("rb") as file:
            line = file.readline(MAX_LINE_PEEK).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    record = _json_or_none(line)
    return isinstance(record, dict) and bool({"run", "result"} & set(record))


def _stream_results(text: str, path: Path) -> list[CaseResult]:
    lines = text.splitlines()
    results = []
    for number, line in enumerate(lines, 1):
        record = _json_or_none(line)
        if record is None and number == len(lines) and not text.endswith("\n"):
            break  # torn by a kill mid-write
        where = f"{path}:{number} "
        if record is None:
            raise SpecError(where.rstrip(), str(path), f"{STREAM_TEXT} (line {number} is not JSON)")
        result = validate(StreamLineModel, record, where).result
        if result is not None:
            results.append(result)
    return results


def _json_or_none(text: str) -> Any:
    try:
        return parse_json(text)
    except ValueError:
        return None


class ResultStream:
    """The JSONL stream: a {"run": info} line, then one {"result": ...} line per result, each written
    with one write() and fsync'd before the next result is made.

    append=True keeps what the file holds (a resumed run adds to its own stream) after cutting a
    torn last line; otherwise the file starts empty. A write that fails (a full disk) is OutputError
    naming `field`: every line before it stays whole, the failing one at most torn (load_results
    ignores a torn last line). With `flush_seconds` > 0 lines are held in memory and written (and
    fsync'd) together once that long has passed since the last write, and at close: a campaign of
    hundreds of results a second would otherwise spend its time in fsync.
    """

    def __init__(self, path: str | Path, append: bool = False, field: str = "stream",
                 flush_seconds: float = 0.0) -> None:
        self.path, self.field = Path(path), field
        self.flush_seconds, self.held, self.flushed = flush_seconds, bytearray(), time.monotonic()
        target = regular_target(self.path, field)  # a FIFO or a device is refused, a link written through
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if append and target.exists():
                _cut_torn_line(target)
        except OSError as exc:
            raise OutputError(field, self.path, cannot_write(exc)) from None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self.fd: int | None = open_regular(self.path, flags, field)

    def header(self, info: dict[str, Any]) -> None:
        self._line({"run": to_jsonable(info)})

    def write(self, result: CaseResult) -> None:
        self._line({"result": to_jsonable(result)})

    def _line(self, record: dict[str, Any]) -> None:
        if self.fd is None:
            raise OutputError(self.field, self.path, "written after it was closed")
        self.held += (json.dumps(record) + "\n").encode()
        if time.monotonic() - self.flushed >= self.flush_seconds:
            self._flush()

    def _flush(self) -> None:
        """Write and fsync the lines held so far."""
        assert self.fd is not None
        data, self.held, self.flushed = bytes(self.held), bytearray(), time.monotonic()
        try:
            while data:
                data = data[os.write(self.fd, data):]
            os.fsync(self.fd)  # on the disk now: neither a SIGKILL nor a power cut loses it
        except OSError as exc:
            raise OutputError(self.field, self.path, cannot_write(exc)) from None

    def close(self) -> None:
        if self.fd is not None:
            try:
                if self.held:
                    self._flush()
            finally:
                fd, self.fd = self.fd, None
                os.close(fd)


def _cut_torn_line(path: Path) -> None:
    """Drop whatever follows the last newline (a line a killed run did not finish)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[:data.rfind(b"\n") + 1])
