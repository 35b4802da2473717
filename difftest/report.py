"""Reports: the per-backend table with the -inf-mask headline, failure details, and JSON."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any

from difftest.runner import CaseResult
from difftest.verdict import Verdict, worst


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
        skip_reasons=sorted({r.reason or "" for r in results if r.verdict == Verdict.SKIP}))


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
        lines.append(f"{s.backend:<28} {s.cases:>5} {s.rows:>6}  {mismatch:<18}  {err:>11}  "
                     f"{overlap:>13}  {verdict}")
    return "\n".join(lines)


def render_failures(results: list[CaseResult], limit: int = 20) -> str:
    """One line per failing (backend, case): verdict, mask rows, first mismatch, or the error."""
    lines = []
    for r in [r for r in results if r.verdict.failed][:limit]:
        lines.append(f"{r.backend} on {r.case} [{r.description}]: {r.verdict.value} "
                     f"(encoding {r.encoding}{', overridden' if r.overridden else ''})")
        if r.comparison is None:
            lines.append(f"    {r.reason}")
            continue
        c = r.comparison
        lines.append(f"    {len(c.mask_rows)}/{c.rows} rows with the wrong -inf mask {_few(c.mask_rows)}; "
                     f"NaN rows {_few(c.nan_rows)}; unwritten rows {_few(c.unwritten_rows)}; "
                     f"value rows {_few(c.value_rows)}")
        if c.first_mismatch:
            m = c.first_mismatch
            lines.append(f"    first mismatch: row {m.row}, position {m.position}: expected {m.expected!r}, "
                         f"got {m.got!r} ({m.kind.value})")
    hidden = sum(r.verdict.failed for r in results) - limit
    if hidden > 0:
        lines.append(f"... and {hidden} more failing results in the JSON report")
    return "\n".join(lines)


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
