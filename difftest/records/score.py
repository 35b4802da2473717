"""A selftest's score as its report records it (the report's `selftest` section): one MutantScore per mutant
and the SelftestScore around them, each its one definition: what difftest.workflows.selftest makes, what
the report writes, and what a report read back (difftest.matrix.merge) holds."""

from __future__ import annotations

import dataclasses
import enum
import math

from difftest.core.schema import MAX_ITEMS, Bool, Count, Float, ListOf, Member, Name, OneOf, Record, Text, TupleOf
from difftest.core.verdict import Verdict


class Status(str, enum.Enum):
    """What became of one mutant."""

    CAUGHT = "caught"
    MISSED = "missed"  # no case failed
    PASSED = "passed"  # a mutant that must pass did
    FALSE_POSITIVE = "false positive"  # a mutant that must pass failed


@dataclasses.dataclass(frozen=True)
class MutantScore(Record):
    """One mutant's row of the score."""

    mutant: Name  # the backend's name
    bug_class: Name
    expected: Name  # the family that should catch it, 'fuzz', or 'pass'
    production_only: Bool
    status: Member(Status)
    expected_here: Bool  # whether this plan could have caught it (its family in the plan, its needs met)
    ok: Bool  # whether it did what was expected: caught by its family, passed, or missed with a reason
    # families of the cases that failed it; 'fuzz' for the fuzz round
    caught_by: TupleOf(Name, MAX_ITEMS, "a list of edge families") = ()
    first_case: Name | None = None  # the first case that failed it
    first_verdict: OneOf(Verdict) | None = None
    seconds: Float(0.0, math.inf) | None = None  # from the selftest's start to its first failure
    cases: Count = 0  # cases it ran
    why: Text() = ""  # a miss or a false positive explained; a catch by other families than expected


@dataclasses.dataclass(frozen=True)
class SelftestScore(Record):
    """The report's `selftest` section: the summary line, whether every mutant did what was expected, the
    template whose envelope the mutants took, the times, and every mutant's row."""

    what = "a JSON object {summary, status, template, envelope, seconds, fuzz_seconds, mutants}"
    summary: Text()
    status: OneOf(("OK", "FAILED"))
    template: Name | None
    envelope: Text()  # the mutants' contract's library: whose envelope it is
    seconds: Float(0.0, math.inf)
    fuzz_seconds: Float(0.0, math.inf) | None
    mutants: ListOf(MutantScore, MAX_ITEMS, "a list of mutant scores")
