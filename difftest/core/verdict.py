"""Verdicts and their reasons, as data: the report renders them, nothing re-parses strings."""

from __future__ import annotations

import dataclasses
import enum


class Verdict(str, enum.Enum):
    """Outcome of one backend on one case, worst first in `severity`."""

    PASS = "PASS"
    CRASH = "CRASH"  # the worker died under the call: a signal, an abort, or a sticky CUDA error
    TIMEOUT = "TIMEOUT"  # the call ran past the run's --timeout and its worker was killed
    FAIL_MUTATED_INPUT = "FAIL(mutated-input)"  # the backend wrote into a tensor it was handed to read
    FAIL_SANITIZER = "FAIL(sanitizer)"  # compute-sanitizer reported errors when the case was replayed
    FAIL_NONDETERMINISTIC = "FAIL(nondeterministic)"  # identical launches disagreed beyond tolerance
    FAIL_MASK = "FAIL(mask)"  # a -inf where a value belongs, or a finite value where -inf is promised
    FAIL_VALUE = "FAIL(value)"  # values outside the backend's tolerance
    FAIL_NAN = "FAIL(nan)"  # NaN inside the causal window
    FAIL_UNWRITTEN = "FAIL(unwritten)"  # the poison the output was pre-filled with is still there
    ERROR = "ERROR"  # the backend raised
    SKIP = "SKIP"  # the backend cannot run this case here; the reason says why

    @property
    def failed(self) -> bool:
        return self not in (Verdict.PASS, Verdict.SKIP)


# Which verdict a row (or a result) takes when it shows several symptoms: the one that explains the
# others. A backend that writes into its inputs, or where the sanitizer says it must not, explains
# anything wrong in its output; launches that disagree explain values out of tolerance, but a wrong
# -inf mask or NaN stays the headline, since that is what a top-k consumer trips on (the stability
# record still says the launches disagreed).
SEVERITY = (Verdict.CRASH, Verdict.TIMEOUT, Verdict.ERROR, Verdict.FAIL_MUTATED_INPUT, Verdict.FAIL_SANITIZER,
            Verdict.FAIL_UNWRITTEN, Verdict.FAIL_NAN, Verdict.FAIL_MASK, Verdict.FAIL_NONDETERMINISTIC,
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
