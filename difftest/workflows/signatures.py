"""Fuzz signatures: a campaign's failing results grouped by root cause, each with the variants it showed.

One bug shows in many ways: the first wrong row falls on another draft row, a case shows wrong values
beside its wrong mask, the shapes differ. A signature keeps only what names the cause: the backend,
the verdict, and what explains it: for a wrong -inf mask the relation difftest.engine.explain fitted
to the wrong windows (its Explanation's Relation, with its parameters, as the result's comparison
records it), for wrong values the pattern of the rows that hold them (the request after an empty one),
for a top-k selection the pattern its comparison found (every index off by its row's start), for an
ERROR the exception's type. The rest are its variants, counted under it: which
draft row the first wrong row is, which kinds of wrong rows the case has (mask, nan, unwritten,
value), and the shapes of the cases.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from difftest.core.case import Case
from difftest.core.verdict import Verdict
from difftest.engine.explain import Relation
from difftest.engine.result import CaseResult
from difftest.engine.topk_comparison import TopkPattern
from difftest.records.report import relation_name

SHOWN = 4  # variants of each kind the campaign's end lists (the JSON report has them all)


@dataclasses.dataclass(frozen=True)
class Signature:
    """A root cause: what one bug keeps in every case it shows in."""

    backend: str
    verdict: Verdict
    relation: Relation | None = None  # what the wrong -inf masks follow, with its parameters, where there are any
    error: str | None = None  # the exception's type, for an ERROR or CRASH that raised one
    selection: TopkPattern | None = None  # what explains a top-k answer's wrong rows, where a known pattern does

    def describe(self) -> str:
        """'window-one-short: FAIL(mask), constant offset -1'."""
        cause = [relation_name(self.relation)] if self.relation is not None else []
        cause += [self.selection.value] if self.selection is not None else []
        cause += [f"raised {self.error}"] if self.error is not None else []
        return f"{self.backend}: {self.verdict.value}" + (f", {', '.join(cause)}" if cause else "")


@dataclasses.dataclass
class Variants:
    """How the results of one signature differ, each variant with the number of results that showed it."""

    draft_rows: Counter[int] = dataclasses.field(default_factory=Counter)  # draft row j of the first wrong row
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)  # 'mask+value': the kinds of wrong rows
    shapes: Counter[str] = dataclasses.field(default_factory=Counter)  # 'next_n 2, H 64, D 128, block 64'

    def add(self, result: CaseResult, case: Case) -> None:
        """Count the variants `result` (on `case`) shows."""
        c = result.comparison
        if c is not None and c.first_mismatch is not None:
            self.draft_rows[c.first_mismatch.row % case.next_n] += 1
        if c is not None:
            self.kinds["+".join(kind for kind, rows in (("mask", c.mask_rows), ("nan", c.nan_rows),
                                                        ("unwritten", c.unwritten_rows), ("value", c.value_rows))
                                if rows) or "no rows"] += 1
        self.shapes[f"next_n {case.next_n}, H {case.heads}, D {case.head_dim}, block {case.block_size}"] += 1

    def merge(self, other: Variants) -> None:
        """Count `other`'s variants too (a signature found by several jobs, or shrunk to one case)."""
        self.draft_rows.update(other.draft_rows)
        self.kinds.update(other.kinds)
        self.shapes.update(other.shapes)

    def describe(self) -> str:
        """'draft rows 0 (12), 1 (3); rows mask (10), mask+value (5); shapes next_n 2, H 64, ... (15)'."""
        parts = [f"{label} {_counted(counter)}" for label, counter in
                 (("draft rows", self.draft_rows), ("rows", self.kinds), ("shapes", self.shapes)) if counter]
        return "; ".join(parts)

    def to_json(self) -> dict[str, dict[str, int]]:
        """Every variant and its count, most frequent first."""
        return {name: {str(k): n for k, n in counter.most_common()} for name, counter in
                (("draft_rows", self.draft_rows), ("kinds", self.kinds), ("shapes", self.shapes))}


def signature(result: CaseResult) -> Signature:
    """The signature of a failing result."""
    explanation = result.comparison.explanation if result.comparison is not None else None
    error = result.error_type if result.verdict in (Verdict.ERROR, Verdict.CRASH) else None
    selection = result.selection.pattern if result.selection is not None else None
    return Signature(result.backend, result.verdict, explanation.relation if explanation is not None else None, error,
                     selection)


def _counted(counter: Counter[object]) -> str:
    shown = ", ".join(f"{value} ({n})" for value, n in counter.most_common(SHOWN))
    more = len(counter) - SHOWN
    return shown + (f", and {more} more" if more > 0 else "")
