"""JSON: results as plain JSON and back, and the JSONL stream a run appends to as it goes.

The JSONL stream (ResultStream): one line per result, appended and flushed the moment the result is
made, so a run killed half-way keeps every result it finished. A line is either {"run": {...}}
(written when a run starts or resumes) or {"result": {...}} (to_jsonable of a CaseResult).
load_results reads a stream or a JSON report (difftest.records.report.write_json) back into CaseResults.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from difftest.core.contract import Siblings
from difftest.core.errors import OutputError, SpecError
from difftest.core.files import cannot_write, open_regular, regular_target
from difftest.core.kinds import (
    CacheLayout,
    Isolation,
    LengthEncoding,
    MetamorphicRelation,
    OperationKind,
    SanitizerTool,
    TimedRegion,
    TimingMethod,
)
from difftest.core.schema import (
    STREAM_TEXT,
    ReportModel,
    ResultModel,
    StreamLineModel,
    parse_json,
    read_text,
    shown,
    validate,
)
from difftest.core.verdict import Mismatch, Verdict
from difftest.engine.comparison import Comparison
from difftest.engine.explain import LEGACY_PATTERNS, Example, Explanation, Pattern, Relation, Rounding
from difftest.engine.result import CallMemory, CaseResult, Reach, Selection, Violation
from difftest.engine.sanitize import Finding, SanitizerReport
from difftest.engine.stability import Stability, StabilityKind
from difftest.engine.timing import Timing

MAX_LINE_PEEK = 1 << 20  # is_stream reads this much of the first line at most


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums and floats (inf, NaN as strings) as plain JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def result_from_json(data: dict[str, Any]) -> CaseResult:
    """The CaseResult to_jsonable wrote (non-finite floats come back from their 'inf'/'nan' strings);
    SpecError naming the first field that does not fit difftest.core.schema.ResultModel ('result.verdict')."""
    validate(ResultModel, data, "result.")
    return _built(data)


def _built(data: dict[str, Any]) -> CaseResult:
    """The CaseResult of `data`, which fits ResultModel."""
    nested = {
        "verdict": Verdict(data["verdict"]), "seconds": float(data["seconds"]),
        "encoding": _maybe(LengthEncoding, data["encoding"]), "layout": _maybe(CacheLayout, data["layout"]),
        "operation": OperationKind(data.get("operation", OperationKind.PAGED_LOGITS.value)),
        "selection": _maybe(selection_from_json, data.get("selection")),
        "isolation": _maybe(Isolation, data.get("isolation")),
        "comparison": _maybe(_comparison, data.get("comparison")),
        "mutated_inputs": tuple(data.get("mutated_inputs", ())),
        "stability": _maybe(_stability, data.get("stability")),
        "sanitizer": _maybe(_sanitizer, data.get("sanitizer")),
        "reach": _maybe(lambda r: Reach(**{**r, "families": tuple(r["families"])}), data.get("reach")),
        "timing": _maybe(_timing, data.get("timing")),
        "memory": _maybe(lambda m: CallMemory(**m), data.get("memory")),
        "metamorphic": tuple(_violation(v) for v in data.get("metamorphic", ())),
    }
    return CaseResult(**{**data, **nested})


def _maybe(build: Any, value: Any) -> Any:
    return None if value is None else build(value)


def _comparison(data: dict[str, Any]) -> Comparison:
    floats = {k: float(data[k]) for k in ("max_abs_err", "max_rel_err")}
    first = _maybe(lambda m: Mismatch(m["row"], m["position"], float(m["expected"]), float(m["got"]),
                                      Verdict(m["kind"])), data.get("first_mismatch"))
    limits = tuple(tuple(limit) for limit in data.get("mask_limits", ()))
    return Comparison(**{**data, **floats, "first_mismatch": first, "verdict": Verdict(data["verdict"]),
                         "topk_overlap": _maybe(float, data["topk_overlap"]), "mask_limits": limits,
                         "explanation": _maybe(_explanation, data.get("explanation"))})


def selection_from_json(data: dict[str, Any]) -> Selection:
    """The Selection to_jsonable wrote."""
    return Selection(**{**data, "wrong_rows": tuple(data["wrong_rows"]),
                        "symptoms": {k: tuple(v) for k, v in data["symptoms"].items()}})


def _explanation(data: dict[str, Any]) -> Explanation:
    """An Explanation; one an older report wrote (a pattern and its description, no relation) reads as its
    pattern's relation, without parameters (the description is not read back)."""
    fields = {k: v for k, v in data.items() if k not in ("pattern", "description")}
    relation = _relation(data["relation"]) if data.get("relation") is not None else \
        Relation(LEGACY_PATTERNS.get(data["pattern"]) or Pattern(data["pattern"]))
    return Explanation(**{**fields, "relation": relation, "draft_rows": tuple(data.get("draft_rows", ())),
                          "example": _maybe(lambda e: Example(**e), data.get("example")),
                          "differences": tuple(tuple(d) for d in data.get("differences", ())),
                          "alternatives": tuple(_relation(r) for r in data.get("alternatives", ()))})


def _relation(data: dict[str, Any]) -> Relation:
    return Relation(**{**data, "pattern": Pattern(data["pattern"]), "rounding": _maybe(Rounding, data.get("rounding"))})


def _violation(data: dict[str, Any]) -> Violation:
    floats = {k: float(data[k]) for k in ("original", "related_value", "expected")}
    return Violation(**{**data, **floats, "relation": MetamorphicRelation(data["relation"]),
                        "related": tuple(data["related"]),
                        "rows": tuple(data["rows"])})


def _stability(data: dict[str, Any]) -> Stability:
    return Stability(**{**data, "kind": StabilityKind(data["kind"]), "max_abs_diff": float(data["max_abs_diff"])})


def _timing(data: dict[str, Any]) -> Timing:
    floats = {k: float(data[k]) for k in ("median", "minimum", "maximum")}
    return Timing(**{**data, **floats, "method": TimingMethod(data["method"]), "region": TimedRegion(data["region"]),
                     "siblings": _maybe(lambda s: Siblings(s["group"], float(s["slowdown"])), data.get("siblings"))})


def _sanitizer(data: dict[str, Any]) -> SanitizerReport:
    findings = tuple(Finding(**{**f, "details": tuple(f["details"])}) for f in data.get("findings", ()))
    return SanitizerReport(**{**data, "tool": SanitizerTool(data["tool"]), "findings": findings})


def load_results(path: str | Path, field: str = "resume") -> list[CaseResult]:
    """Every result of a JSON report (write_json) or of a JSONL stream (ResultStream).

    A stream's last line may be torn (the run was killed while writing it): it is ignored. The file
    is checked against difftest.core.schema (ReportModel, StreamLineModel) before any result is built: a
    SpecError names `field`, the bad value, what is allowed and where ('at r.jsonl:3 result.verdict'),
    or why the file cannot be read.
    """
    path = Path(path)
    text = read_text(path, field, "report or stream")
    try:
        document = _json_or_none(text)
        # One JSON object that is not one stream record ({"run": ...} or {"result": ...}) is a report.
        if isinstance(document, dict) and not (len(document) == 1 and {"run", "result"} & set(document)):
            validate(ReportModel, document, f"{path} ")
            return [_built(r) for r in document["results"]]
        return _stream_results(text, path)
    except SpecError as exc:  # named after `field` (the option that gave the file), the place in it after
        raise SpecError(field, exc.value, f"{exc.expected}, at {exc.field}") from None


def load_run_info(path: str | Path, field: str = "resume") -> list[dict[str, Any]]:
    """How the results of a report or stream were made: a JSON report's `run`, or every {"run": ...}
    line of a stream (one per session: a resumed run adds its own). Read after load_results has
    checked the file; SpecError naming `field` when it cannot be read."""
    text = read_text(path, field, "report or stream")
    document = _json_or_none(text)
    if isinstance(document, dict) and not (len(document) == 1 and {"run", "result"} & set(document)):
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
            raise SpecError(where.rstrip(), shown(line, 80), STREAM_TEXT)
        validate(StreamLineModel, record, where)
        if "result" in record:
            results.append(_built(record["result"]))
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
