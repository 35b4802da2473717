"""Verdicts and their reasons, as data: the report renders them, nothing re-parses strings."""

from __future__ import annotations

import dataclasses
import enum


class Verdict(str, enum.Enum):
    """Outcome of one backend on one case, worst first in `severity`."""

    PASS = "PASS"
    FAIL_MASK = "FAIL(mask)"  # a -inf where a value belongs, or a finite value where -inf is promised
    FAIL_VALUE = "FAIL(value)"  # values outside the backend's tolerance
    FAIL_NAN = "FAIL(nan)"  # NaN inside the causal window
    FAIL_UNWRITTEN = "FAIL(unwritten)"  # the poison the output was pre-filled with is still there
    ERROR = "ERROR"  # the backend raised
    SKIP = "SKIP"  # the backend cannot run this case here; the reason says why

    @property
    def failed(self) -> bool:
        return self not in (Verdict.PASS, Verdict.SKIP)


# Which verdict a row takes when it shows several symptoms: the one that explains the others.
SEVERITY = (Verdict.ERROR, Verdict.FAIL_UNWRITTEN, Verdict.FAIL_NAN, Verdict.FAIL_MASK,
            Verdict.FAIL_VALUE, Verdict.PASS, Verdict.SKIP)


def worst(verdicts: list[Verdict]) -> Verdict:
    """The most severe of `verdicts` (PASS for none)."""
    return min(verdicts, key=SEVERITY.index, default=Verdict.PASS)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first disagreeing position of a row, with both values (None stands for -inf/NaN text)."""

    row: int
    position: int
    expected: float
    got: float
    kind: Verdict
