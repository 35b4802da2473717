"""Verdicts and their reasons, as data: the report renders them, nothing re-parses strings."""

from __future__ import annotations

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
    # The top-k operation (difftest.engine.topk_comparison, docs/reference/topk.md):
    FAIL_GARBAGE = "FAIL(garbage)"  # a top-k index that names no column of the row (NaN, uninitialised memory)
    FAIL_OUT_OF_WINDOW = "FAIL(out-of-window)"  # a top-k index outside the row's window
    FAIL_DUPLICATE = "FAIL(duplicate)"  # one column returned twice in a row
    # -1 where a candidate exists, a real index where -1 is promised, or no -1 past the candidates:
    FAIL_PADDING = "FAIL(padding)"
    FAIL_MISSING = "FAIL(missing)"  # a value that belongs to the top k is left out and a smaller one taken
    FAIL_ORDER = "FAIL(order)"  # the right set in the wrong order, where descending order is promised
    # A metamorphic relation does not hold: the backend's logits on a related case (pages permuted, requests
    # reordered, ...) do not follow from its logits on the case (difftest.engine.metamorphic)
    FAIL_METAMORPHIC = "FAIL(metamorphic)"
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
# The top-k verdicts rank below the logits' NaN and mask ones, which explain a wrong selection in a pipeline
# (a NaN logit is how vLLM's top-k came to return uninitialised indices, vllm#49896). Among themselves: an
# index naming no column explains anything else in its row; an out-of-window index, a duplicate or a -1
# where a candidate exists each takes a slot a candidate needed, so each explains the missing candidate it
# causes; a wrong order is a right set. A missing candidate outranks launches that disagree, as a wrong mask
# does: a wrong set is what the sparse attention reads.
# A violated metamorphic relation ranks below every verdict of the oracle's comparison: it says that two
# outputs are inconsistent, not which positions are wrong, so where the comparison found the wrong
# positions its verdict is the headline (the violation stays in the result).
SEVERITY = (Verdict.CRASH, Verdict.TIMEOUT, Verdict.ERROR, Verdict.FAIL_MUTATED_INPUT, Verdict.FAIL_SANITIZER,
            Verdict.FAIL_UNWRITTEN, Verdict.FAIL_NAN, Verdict.FAIL_MASK, Verdict.FAIL_GARBAGE,
            Verdict.FAIL_OUT_OF_WINDOW, Verdict.FAIL_DUPLICATE, Verdict.FAIL_PADDING, Verdict.FAIL_MISSING,
            Verdict.FAIL_NONDETERMINISTIC, Verdict.FAIL_VALUE, Verdict.FAIL_ORDER, Verdict.FAIL_METAMORPHIC,
            Verdict.PASS, Verdict.SKIP)


def worst(verdicts: list[Verdict]) -> Verdict:
    """The most severe of `verdicts` (PASS for none)."""
    return min(verdicts, key=SEVERITY.index, default=Verdict.PASS)
