"""Reports: the per-backend table with the -inf-mask headline, the results per GPU, failure details, JSON and JSONL.

Two files, both optional:
* the JSON report (write_json): written once at the end: the run, the summaries, every result;
* the JSONL stream (ResultStream): one line per result, appended and flushed the moment the
  result is made, so a run killed half-way keeps every result it finished. A line is either
  {"run": {...}} (written when a run starts or resumes) or {"result": {...}} (to_jsonable of a
  CaseResult). `difftest run --resume FILE` reads either kind of file (load_results) and runs
  only the (backend, case) pairs it lacks.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import Counter
from pathlib import Path
from typing import IO, Any

from difftest.compare import Comparison
from difftest.errors import SpecError
from difftest.guards import Stability, StabilityKind
from difftest.runner import CaseResult
from difftest.sanitize import Finding, SanitizerReport
from difftest.verdict import Mismatch, Verdict, worst


@dataclasses.dataclass(frozen=True)
class BackendSummary:
    """One backend over a whole run."""

    backend: str
    cases: int  # cases it ran (not skipped)
    skipped: int
    rows: int  # rows compared
    mask_rows: int  # rows with a wrong -inf mask: the headline numerator
    max_rel_err: float
    topk_overlap: float  # worst case's mean overlap
    verdict: Verdict
    counts: dict[str, int]  # verdict -> cases
    skip_reasons: list[str]
    stability: str | None = None  # the least stable kind over its repeated cases, with the launches


def summarize(results: list[CaseResult]) -> list[BackendSummary]:
    """One summary per backend, in the order backends first appear."""
    names = list(dict.fromkeys(r.backend for r in results))
    return [_summary(name, [r for r in results if r.backend == name]) for name in names]


def _summary(name: str, results: list[CaseResult]) -> BackendSummary:
    compared = [r.comparison for r in results if r.comparison is not None]
    ran = [r for r in results if r.verdict != Verdict.SKIP]
    verdicts = [r.verdict for r in results]
    counts = {v.value: verdicts.count(v) for v in Verdict if v in verdicts}
    overall = Verdict.SKIP if not ran else worst([r.verdict for r in ran])
    return BackendSummary(
        backend=name, cases=len(ran), skipped=len(results) - len(ran),
        rows=sum(c.rows for c in compared), mask_rows=sum(len(c.mask_rows) for c in compared),
        max_rel_err=max((c.max_rel_err for c in compared), default=0.0),
        topk_overlap=min((c.topk_overlap for c in compared), default=math.nan),
        verdict=overall, counts=counts,
        skip_reasons=sorted({r.reason or "" for r in results if r.verdict == Verdict.SKIP}),
        stability=_least_stable([r.stability for r in results if r.stability is not None]))


def _least_stable(stabilities: list[Stability]) -> str | None:
    """'bitwise-stable x3', 'unstable x3', ...: the least stable of the cases and its launch count."""
    order = list(StabilityKind)
    least = max(stabilities, key=lambda s: order.index(s.kind), default=None)
    return None if least is None else f"{least.kind.value} x{least.launches}"


def headline(summary: BackendSummary) -> str:
    """'48/48 rows with the wrong -inf mask': the number a kernel engineer reads first."""
    return f"{summary.mask_rows}/{summary.rows} rows with the wrong -inf mask"


def render_table(summaries: list[BackendSummary]) -> str:
    """The fixed-width table `difftest run` ends with."""
    header = (f"{'backend':<28} {'cases':>5} {'rows':>6}  {'-inf-mask mismatch':<18}  "
              f"{'max rel err':>11}  {'top-k overlap':>13}  verdict")
    lines = [header]
    for s in summaries:
        overlap = "-" if math.isnan(s.topk_overlap) else f"{s.topk_overlap:.3f}"
        err = "-" if not s.rows else f"{s.max_rel_err:.2e}" if s.max_rel_err else "0"
        mismatch = f"{s.mask_rows}/{s.rows}" if s.cases else "-"
        verdict = s.verdict.value if s.verdict != Verdict.PASS or not s.skipped else f"PASS ({s.skipped} skipped)"
        if s.verdict == Verdict.SKIP:
            verdict = f"SKIP: {s.skip_reasons[0] if s.skip_reasons else ''}"
        if s.stability:
            verdict += f" [{s.stability}]"
        lines.append(f"{s.backend:<28} {s.cases:>5} {s.rows:>6}  {mismatch:<18}  {err:>11}  "
                     f"{overlap:>13}  {verdict}")
    return "\n".join(lines)


def render_devices(results: list[CaseResult]) -> str:
    """'results per device: cuda:0 NVIDIA H200 (PCI ...): 44, cuda:0 NVIDIA H200 (PCI ...): 44' when the
    results were computed on more than one GPU (CaseResult.gpu); '' otherwise."""
    counts = Counter(r.gpu for r in results if r.gpu is not None)
    if len(counts) < 2:
        return ""
    return "results per device: " + ", ".join(f"{gpu}: {n}" for gpu, n in counts.items())


def render_failures(results: list[CaseResult], limit: int = 20) -> str:
    """One block per failing (backend, case): verdict, mask rows, first mismatch or the error, and
    what the guards found (inputs written, launches disagreeing, sanitizer errors)."""
    lines = []
    for r in [r for r in results if r.verdict.failed][:limit]:
        lines.append(f"{r.backend} on {r.case} [{r.description}]: {r.verdict.value} "
                     f"(encoding {r.encoding}{', overridden' if r.overridden else ''})")
        lines += [f"    {line}" for line in _comparison_lines(r) + _guard_lines(r)]
    hidden = sum(r.verdict.failed for r in results) - limit
    if hidden > 0:
        lines.append(f"... and {hidden} more failing results in the JSON report")
    return "\n".join(lines)


def _comparison_lines(r: CaseResult) -> list[str]:
    if r.comparison is None:
        return [r.reason or ""]
    c = r.comparison
    lines = [f"{len(c.mask_rows)}/{c.rows} rows with the wrong -inf mask {_few(c.mask_rows)}; "
             f"NaN rows {_few(c.nan_rows)}; unwritten rows {_few(c.unwritten_rows)}; "
             f"value rows {_few(c.value_rows)}"]
    if c.first_mismatch:
        m = c.first_mismatch
        lines.append(f"first mismatch: row {m.row}, position {m.position}: expected {m.expected!r}, "
                     f"got {m.got!r} ({m.kind.value})")
    return lines


def _guard_lines(r: CaseResult) -> list[str]:
    lines = []
    if r.mutated_inputs:
        lines.append(f"wrote into its inputs: {', '.join(r.mutated_inputs)}")
    s = r.stability
    if s is not None and s.kind != StabilityKind.BITWISE:
        lines.append(f"{s.kind.value} over {s.launches} launches: rows {_few(s.moved_rows)} moved, "
                     f"{_few(s.unstable_rows)} past the tolerance (max |diff| {s.max_abs_diff:.3g})")
    if r.sanitizer is not None:
        lines.append(r.sanitizer.summary())
    return lines


def _few(rows: list[int], shown: int = 8) -> str:
    if not rows:
        return "none"
    text = ",".join(map(str, rows[:shown]))
    return f"[{text}{',...' if len(rows) > shown else ''}]"


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


def write_json(path: str | Path, results: list[CaseResult], run_info: dict[str, Any]) -> Path:
    """The whole run: how it was made, the summaries and every result."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"run": run_info, "summaries": to_jsonable(summarize(results)), "results": to_jsonable(results)}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


# --------------------------------------------------------------------------- reading results back

def result_from_json(data: dict[str, Any]) -> CaseResult:
    """The CaseResult to_jsonable wrote (non-finite floats come back from their 'inf'/'nan' strings)."""
    known = {f.name for f in dataclasses.fields(CaseResult)}
    unknown = set(data) - known
    if unknown:
        raise SpecError("result", sorted(unknown), f"fields among {sorted(known)}")
    nested = {
        "verdict": Verdict(data["verdict"]), "seconds": float(data["seconds"]),
        "comparison": _maybe(_comparison, data.get("comparison")),
        "mutated_inputs": tuple(data.get("mutated_inputs", ())),
        "stability": _maybe(_stability, data.get("stability")),
        "sanitizer": _maybe(_sanitizer, data.get("sanitizer")),
    }
    return CaseResult(**{**data, **nested})


def _maybe(build: Any, value: Any) -> Any:
    return None if value is None else build(value)


def _comparison(data: dict[str, Any]) -> Comparison:
    floats = {k: float(data[k]) for k in ("max_abs_err", "max_rel_err", "topk_overlap")}
    first = _maybe(lambda m: Mismatch(m["row"], m["position"], float(m["expected"]), float(m["got"]),
                                      Verdict(m["kind"])), data.get("first_mismatch"))
    return Comparison(**{**data, **floats, "first_mismatch": first, "verdict": Verdict(data["verdict"])})


def _stability(data: dict[str, Any]) -> Stability:
    return Stability(**{**data, "kind": StabilityKind(data["kind"]), "max_abs_diff": float(data["max_abs_diff"])})


def _sanitizer(data: dict[str, Any]) -> SanitizerReport:
    findings = tuple(Finding(**{**f, "details": tuple(f["details"])}) for f in data.get("findings", ()))
    return SanitizerReport(**{**data, "findings": findings})


def load_results(path: str | Path, field: str = "--resume") -> list[CaseResult]:
    """Every result of a JSON report (write_json) or of a JSONL stream (ResultStream).

    A stream's last line may be torn (the run was killed while writing it): it is ignored. Any
    other unreadable line is a SpecError naming `field`, the file and the line.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(field, str(path), f"a readable report or stream ({exc.strerror})") from None
    with_results = _json_or_none(text)
    if isinstance(with_results, dict) and "results" in with_results:
        return [_result(r, field, path) for r in with_results["results"]]
    return _stream_results(text, field, path)


def is_stream(path: str | Path) -> bool:
    """Whether `path` holds a JSONL stream (its first line a {"run": ...} or {"result": ...} record)."""
    with Path(path).open() as file:
        record = _json_or_none(file.readline())
    return isinstance(record, dict) and bool({"run", "result"} & set(record))


def _stream_results(text: str, field: str, path: Path) -> list[CaseResult]:
    lines = text.splitlines()
    results = []
    for number, line in enumerate(lines, 1):
        record = _json_or_none(line)
        if record is None and number == len(lines) and not text.endswith("\n"):
            break  # torn by a kill mid-write
        if not isinstance(record, dict) or not ({"run"} <= set(record) or {"result"} <= set(record)):
            raise SpecError(field, f"{path}:{number}", 'a JSON report, or JSONL lines {"run": ...} / {"result": ...}')
        if "result" in record:
            results.append(_result(record["result"], field, path))
    return results


def _result(data: Any, field: str, path: Path) -> CaseResult:
    try:
        return result_from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(field, str(path), f"results as difftest writes them ({type(exc).__name__}: {exc})") from None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class ResultStream:
    """The JSONL stream: a {"run": info} line, then one {"result": ...} line per result, each flushed.

    append=True keeps what the file holds (a resumed run adds to its own stream) after cutting a
    torn last line; otherwise the file starts empty.
    """

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append and self.path.exists():
            _cut_torn_line(self.path)
        self.file: IO[str] = self.path.open("a" if append else "w")

    def header(self, info: dict[str, Any]) -> None:
        self._line({"run": to_jsonable(info)})

    def write(self, result: CaseResult) -> None:
        self._line({"result": to_jsonable(result)})

    def _line(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()  # in the kernel's hands now: a SIGKILL of this process cannot lose it

    def close(self) -> None:
        self.file.close()


def _cut_torn_line(path: Path) -> None:
    """Drop whatever follows the last newline (a line a killed run did not finish)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[:data.rfind(b"\n") + 1])
