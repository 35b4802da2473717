"""The greedy loop the ragged and top-k shrinkers share (difftest.generators.ragged_shrink, topk_shrink).

Each round tries the moves in order; a move's candidates are probed one by one, and the first that still fails
(and that the caller's `takes` accepts) becomes the current case, the same move then tried again on it until it
finds nothing more. Rounds repeat until one changes nothing or the budget (seconds, probes or both) is spent.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from difftest.core.errors import SpecError, require

Shrinkable = TypeVar("Shrinkable")


@dataclasses.dataclass(frozen=True)
class Shrunk(Generic[Shrinkable]):
    """The smallest case found that still fails, and what finding it cost."""

    original: Shrinkable
    case: Shrinkable
    probes: int  # still_fails calls
    seconds: float
    finished: bool  # False when the budget ran out before a round changed nothing


@dataclasses.dataclass
class _Budget:
    """What a shrink may still spend: wall-clock seconds (the CLI's bound) and still_fails calls (a bound that
    gives the same answer on a slow machine as on a fast one)."""

    deadline: float  # time.perf_counter() past which no probe starts
    probes_left: float  # math.inf: no bound
    probes: int = 0  # still_fails calls made
    cut: bool = False  # a move's candidates were left untried for want of budget

    def spent(self) -> bool:
        return self.probes_left <= 0 or time.perf_counter() >= self.deadline

    def probe(self, still_fails: Callable[[Shrinkable], bool], candidate: Shrinkable) -> bool:
        self.probes, self.probes_left = self.probes + 1, self.probes_left - 1
        return still_fails(candidate)


def shrink_greedily(case: Shrinkable, still_fails: Callable[[Shrinkable], bool],
                    moves: Sequence[Callable[[Shrinkable], Iterable[Shrinkable]]],
                    takes: Callable[[Shrinkable], bool], budget_seconds: float = math.inf,
                    max_probes: int | None = None) -> Shrunk[Shrinkable]:
    """The smallest case `still_fails` accepts, reached from `case` by `moves` within about `budget_seconds` and
    at most `max_probes` calls of `still_fails` (None: any number), named `<name>-min` when it differs;
    SpecError when `case` itself does not fail."""
    require(max_probes is None or (type(max_probes) is int and max_probes >= 1), "max_probes", max_probes,
            "None or an integer >= 1")
    start = time.perf_counter()
    budget = _Budget(start + budget_seconds, math.inf if max_probes is None else max_probes)
    if not budget.probe(still_fails, case):
        raise SpecError("case", case.name, "a case that fails (still_fails(case) is False)")  # type: ignore[attr-defined]
    current, finished = case, False
    while not (finished or budget.cut):
        changed = False
        for move in moves:
            while (candidate := _first_failing(move(current), still_fails, takes, budget)) is not None:
                current, changed = candidate, True
        finished = not (changed or budget.cut)  # a whole round that found nothing smaller
    named = dataclasses.replace(current, name=f"{case.name}-min") if current is not case else current  # type: ignore
    return Shrunk(case, named, budget.probes, time.perf_counter() - start, finished)


def _first_failing(candidates: Iterable[Shrinkable], still_fails: Callable[[Shrinkable], bool],
                   takes: Callable[[Shrinkable], bool], budget: _Budget) -> Shrinkable | None:
    """The first candidate taken that still fails, or None when none does or the budget ran out first."""
    for candidate in candidates:
        if budget.spent():
            budget.cut = True
            return None
        if takes(candidate) and budget.probe(still_fails, candidate):
            return candidate
    return None
