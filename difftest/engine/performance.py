"""The performance differential (`difftest run --time K`): backends that compute the same logits by
other paths (one `Siblings` group in their contracts: DeepGEMM native, flattened and varlen; AITER's
stage1 and fused kernels) side by side on each case, and every one slower than its fastest sibling
by more than the factor it declares.

A correctness run never sees a path that is four times slower than its sibling (vLLM's varlen path
took 214 us where the fixed one takes 52 us); this does. Only results are read (their Timing, which
carries the declared group), so a report read back, resumed or merged from shards compares the same.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from difftest.core.kinds import TimedRegion
from difftest.core.schema import MAX_ITEMS, Bool, Filled, Float, Member, Name, Record, TupleOf
from difftest.engine.result import CaseResult
from difftest.engine.timing import Timing

TIMER_FLOOR = 1e-9  # seconds: no timer resolves finer, so no ratio divides by less
SHOWN = 20  # slow results listed one per line; the JSON report holds them all


@dataclasses.dataclass(frozen=True)
class SiblingTime(Record):
    """One member of a sibling group on one case."""

    backend: Name
    seconds: Float(0.0, math.inf)  # its median timed launch
    ratio: Float(1, math.inf)  # its seconds over the fastest member's on the case
    allowed: Float(1, math.inf)  # the slowdown it declares (Siblings.slowdown)
    region: Member(TimedRegion)
    slow: Bool  # ratio > allowed


@dataclasses.dataclass(frozen=True)
class SiblingRace(Record):
    """The members of one sibling group timed on one case, fastest first."""

    what = "a JSON object {case, group, times}"
    case: Name
    group: Filled("a non-empty group name")
    times: TupleOf(SiblingTime, MAX_ITEMS, "a list of sibling times, fastest first", low=2)


def races(results: list[CaseResult]) -> list[SiblingRace]:
    """Every (case, group) that two or more members were timed on, in the order the results come."""
    members: dict[tuple[str, str], list[tuple[str, Timing]]] = {}
    for r in results:
        timing = r.timing
        if timing is not None and timing.error is None and timing.siblings is not None:
            members.setdefault((r.case, timing.siblings.group), []).append((r.backend, timing))
    return [_race(case, group, timed) for (case, group), timed in members.items() if len(timed) > 1]


def _race(case: str, group: str, timed: list[tuple[str, Timing]]) -> SiblingRace:
    """The members' times on `case`, fastest first, each as a ratio to the fastest."""
    timed = sorted(timed, key=lambda pair: pair[1].median)
    fastest = max(timed[0][1].median, TIMER_FLOOR)
    times = tuple(_sibling_time(backend, timing, max(timing.median, TIMER_FLOOR) / fastest)
                  for backend, timing in timed)
    return SiblingRace(case, group, times)


def _sibling_time(backend: str, timing: Timing, ratio: float) -> SiblingTime:
    allowed = timing.siblings.slowdown if timing.siblings else 1.0
    return SiblingTime(backend, timing.median, ratio, allowed, timing.region, ratio > allowed)


def slow(found: list[SiblingRace]) -> list[tuple[SiblingRace, SiblingTime]]:
    """Every member slower than its fastest sibling by more than it allows, with its race."""
    return [(race, t) for race in found for t in race.times if t.slow]


def render_performance(found: list[SiblingRace]) -> str:
    """The report's performance section: per group, each member's median ratio to its fastest sibling
    over the cases, then one line per slow result. '' when no two siblings were timed on a case."""
    if not found:
        return ""
    flagged = slow(found)
    cases = len({race.case for race in found})
    groups = list(dict.fromkeys(race.group for race in found))
    lines = [f"performance: siblings timed side by side on {cases} case(s) in {len(groups)} group(s); "
             f"{len(flagged)} slower than allowed"]
    for group in groups:
        lines += _group_lines(group, [race for race in found if race.group == group])
    for race, t in flagged[:SHOWN]:
        fastest = race.times[0]
        lines.append(f"  SLOW: {t.backend} on {race.case} [{race.group}]: {format_seconds(t.seconds)}, "
                     f"{t.ratio:.2f}x {fastest.backend}'s {format_seconds(fastest.seconds)} (allowed {t.allowed:g}x)")
    if len(flagged) > SHOWN:
        lines.append(f"  ... and {len(flagged) - SHOWN} more slow results in the JSON report")
    return "\n".join(lines)


def _group_lines(group: str, found: list[SiblingRace]) -> list[str]:
    """'<group>' then, per member, its median ratio over the group's cases, its allowance and its slow cases."""
    lines = [f"  {group} ({len(found)} case(s)): median ratio to the fastest sibling"]
    entries: dict[str, list[SiblingTime]] = {}
    for race in found:
        for t in race.times:
            entries.setdefault(t.backend, []).append(t)
    for backend, times in sorted(entries.items(), key=lambda item: statistics.median(t.ratio for t in item[1])):
        flagged = sum(t.slow for t in times)
        whole = ", whole call timed: no prepare()" if times[0].region == TimedRegion.WHOLE_CALL else ""
        lines.append(f"    {backend:<28} {statistics.median(t.ratio for t in times):>7.2f}x  (allowed "
                     f"{times[0].allowed:g}x{whole}){f'  SLOW on {flagged} case(s)' if flagged else ''}")
    return lines


def format_seconds(seconds: float) -> str:
    """'52.1 us', '3.4 ms', '1.23 s', '1234 s': three significant digits in the unit that fits."""
    if seconds >= 1000:
        return f"{seconds:.0f} s"
    for unit, size in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds / 1e-6:.3g} us"
