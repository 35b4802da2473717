"""The greedy loop the ragged and top-k shrinkers share (difftest.generators.ragged_shrink, topk_shrink).

Each round tries the moves in order; a move's candidates are probed one by one, and the first that still fails
(and that the caller's `takes` accepts) becomes the current case, the same move then tried again on it until it
finds nothing more. Rounds repeat until one changes nothing or the budget is spent.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from difftest.core.errors import SpecError

Shrinkable = TypeVar("Shrinkable")


@dataclasses.dataclass(frozen=True)
class Shrunk(Generic[Shrinkable]):
    """The smallest case found that still fails, and what finding it cost."""

    original: Shrinkable
    case: Shrinkable
    probes: int  # still_fails calls
    seconds: float
    finished: bool  # False when the budget ran out before a round changed nothing


def shrink_greedily(case: Shrinkable, still_fails: Callable[[Shrinkable], bool],
                    moves: Sequence[Callable[[Shrinkable], Iterable[Shrinkable]]],
                    takes: Callable[[Shrinkable], bool], budget_seconds: float) -> Shrunk[Shrinkable]:
    """The smallest case `still_fails` accepts, reached from `case` by `moves` within about `budget_seconds`,
    named `<name>-min` when it differs; SpecError when `case` itself does not fail."""
    start = time.perf_counter()
    if not still_fails(case):
        raise SpecError("case", case.name, "a case that fails (still_fails(case) is False)")  # type: ignore[attr-defined]
    probes, current, finished = 1, case, False
    deadline = start + budget_seconds
    while time.perf_counter() < deadline:
        changed = False
        for move in moves:
            while (found := _first_failing(move(current), still_fails, takes, deadline)) is not None:
                candidate, tried = found
                probes += tried
                if candidate is None:
                    break
                current, changed = candidate, True
        if not changed:
            finished = time.perf_counter() < deadline
            break
    named = dataclasses.replace(current, name=f"{case.name}-min") if current is not case else current  # type: ignore
    return Shrunk(case, named, probes, time.perf_counter() - start, finished)


def _first_failing(candidates: Iterable[Shrinkable], still_fails: Callable[[Shrinkable], bool],
                   takes: Callable[[Shrinkable], bool], deadline: float) -> tuple[Shrinkable | None, int] | None:
    """(the first candidate taken that still fails, or None when none does; the probes spent), or None when the
    budget ran out first."""
    tried = 0
    for candidate in candidates:
        if time.perf_counter() >= deadline:
            return None
        if not takes(candidate):
            continue
        tried += 1
        if still_fails(candidate):
            return candidate, tried
    return None, tried
