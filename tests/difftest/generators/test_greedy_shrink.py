"""The greedy shrink loop's budget: a probe bound ends it after that many still_fails calls, whatever the clock
says, so a test that bounds it so reaches the same case on a loaded machine as on an idle one."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from difftest.core.errors import SpecError
from difftest.generators.greedy_shrink import shrink_greedily


@dataclasses.dataclass(frozen=True)
class _Count:
    name: str
    n: int


def _smaller(case: _Count) -> list[_Count]:
    return [_Count(case.name, case.n - 1)] if case.n > 0 else []


def _shrunk(start: int, fails_from: int, max_probes: int | None):
    calls: list[int] = []

    def still_fails(case: _Count) -> bool:
        calls.append(case.n)
        return case.n >= fails_from

    shrunk = shrink_greedily(_Count("c", start), still_fails, [_smaller], lambda case: True, math.inf, max_probes)
    return shrunk, calls


@given(start=st.integers(0, 40), fails_from=st.integers(0, 40), max_probes=st.integers(1, 60))
def test_a_probe_bound_is_the_number_of_still_fails_calls_at_most(start, fails_from, max_probes):
    if start < fails_from:
        return
    shrunk, calls = _shrunk(start, fails_from, max_probes)
    assert shrunk.probes == len(calls) <= max_probes, (shrunk, calls)
    needed = _shrunk(start, fails_from, None)[0].probes  # what the shrink takes to its end, unbounded
    assert shrunk.finished == (needed <= max_probes), (shrunk, needed)
    assert shrunk.case.n == max(fails_from, start - (max_probes - 1)), shrunk  # one step down per probe


def test_without_a_probe_bound_the_shrink_runs_until_a_round_changes_nothing():
    shrunk, calls = _shrunk(10, 3, None)
    # down to 3 in the first round (2 passes), then a round that finds nothing smaller ends it
    assert shrunk.finished and shrunk.case == _Count("c-min", 3) and calls == [*range(10, 1, -1), 2], calls


@pytest.mark.parametrize("max_probes", [0, -1, 2.5, True])
def test_a_probe_bound_that_is_no_count_is_refused(max_probes):
    with pytest.raises(SpecError, match="max_probes"):
        _shrunk(10, 3, max_probes)
