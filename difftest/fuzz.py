"""`difftest fuzz`: a time-budgeted campaign over the envelope planner, its failures deduplicated.

Rounds of envelope plans (difftest.plan.envelope_plan) with fresh seeds go through one runner, so the
worker processes start once per campaign, not once per round. Every failing result is reduced to a
signature (backend, verdict, and how the rows fail: the failure kinds present and which draft row of
its request the first wrong row is); the first case of each signature is kept, written as a bundle,
and shrunk (difftest.shrink) after the campaign, in this process, unless it crashed or hung (a case
that kills a process is not probed in-process: its bundle is written as found). The campaign ends at
its budget or at `until_failures` distinct signatures, whichever comes first.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from difftest.backends import Loaded, get_backends
from difftest.bundle import write_bundle
from difftest.case import Case
from difftest.config import RunConfig
from difftest.errors import SpecError, require
from difftest.kinds import Device
from difftest.plan import envelope_plan
from difftest.result import CaseResult
from difftest.runner import run
from difftest.serialize import ResultStream
from difftest.shrink import ShrinkResult, shrink
from difftest.verdict import Verdict
from generators.envelope import Target
from generators.tensors import build_case

ROUND_SEEDS = 1_000_000  # seeds a round's plan spans: rounds never repeat a (spec, seed)
UNSHRINKABLE = (Verdict.CRASH, Verdict.TIMEOUT)  # probing these in-process could take the campaign down


@dataclasses.dataclass(frozen=True)
class Campaign:
    """What a campaign is asked to do. Errors name these fields."""

    budget: float  # seconds of cases (shrinking comes after)
    backends: tuple[str, ...] | None = None
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    until_failures: int | None = None  # stop at this many distinct failure signatures
    seed: int = 0
    repro_dir: Path | None = None  # the first case of each signature goes here as a bundle
    stream: Path | None = None
    shrink_seconds: float = 30.0  # per signature

    def __post_init__(self) -> None:
        require(0 < self.budget <= 7 * 86400, "budget", self.budget, "seconds in (0, one week]")
        require(self.until_failures is None or self.until_failures >= 1, "until_failures", self.until_failures,
                "an integer >= 1")
        require(0 <= self.shrink_seconds <= 3600, "shrink_seconds", self.shrink_seconds, "seconds in [0, 3600]")


@dataclasses.dataclass(frozen=True)
class Signature:
    """How a backend fails, coarsely enough that one bug gives one signature."""

    backend: str
    verdict: Verdict
    kinds: tuple[str, ...]  # the failure kinds present: mask, nan, unwritten, value
    draft_row: int | None  # which draft row (j) of its request the first wrong row is

    def describe(self) -> str:
        where = "" if self.draft_row is None else f", first wrong row is draft row {self.draft_row}"
        return f"{self.backend}: {self.verdict.value} ({'+'.join(self.kinds) or 'no rows'}{where})"


@dataclasses.dataclass
class Found:
    """The first failure of a signature: its case and result, then its bundle and shrunk form."""

    signature: Signature
    case: Case
    result: CaseResult
    target: str  # what loads its backend again: a registered name or 'package.module:object'
    seen: int = 1  # failing results with this signature
    bundle: Path | None = None
    shrunk: ShrinkResult | None = None


@dataclasses.dataclass(frozen=True)
class CampaignOutcome:
    """What a campaign made: every result, its distinct failures, and its rate."""

    results: list[CaseResult]
    found: list[Found]
    cases: int
    seconds: float

    @property
    def cases_per_second(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0


def signature(result: CaseResult, next_n: int) -> Signature:
    """The signature of a failing result."""
    c = result.comparison
    kinds = () if c is None else tuple(kind for kind, rows in (("mask", c.mask_rows), ("nan", c.nan_rows),
                                                                 ("unwritten", c.unwritten_rows),
                                                                 ("value", c.value_rows)) if rows)
    first = None if c is None or c.first_mismatch is None else c.first_mismatch.row % next_n
    return Signature(result.backend, result.verdict, kinds, first)


def fuzz(campaign: Campaign) -> CampaignOutcome:
    """Run `campaign`: cases until its budget or failure count, then a bundle (shrunk) per signature."""
    backends = get_backends(list(campaign.backends) if campaign.backends else None)
    state = _State(campaign, backends)
    start = time.monotonic()
    stream = ResultStream(campaign.stream) if campaign.stream else None
    try:
        results = run(backends, state.cases(start), campaign.config, on_result=state.heard(stream),
                      takes=state.takes)
    finally:
        if stream:
            stream.close()
    seconds = time.monotonic() - start
    for found in state.found.values():
        _keep(found, state.backends[found.signature.backend], campaign)
    return CampaignOutcome(results, _merged(list(state.found.values())), state.drawn, seconds)


def _merged(found: list[Found]) -> list[Found]:
    """One entry per distinct shrunk case: signatures that shrink to the same case are one bug."""
    kept: dict[object, Found] = {}
    for item in found:
        key = (item.signature.backend, item.signature.verdict, item.shrunk.line() if item.shrunk else id(item))
        if key in kept:
            kept[key].seen += item.seen
        else:
            kept[key] = item
    return list(kept.values())


class _State:
    """What the campaign knows while it runs: the case being run, the signatures found so far."""

    def __init__(self, campaign: Campaign, backends: list[Loaded]) -> None:
        self.campaign, self.backends = campaign, {b.name: b for b in backends}
        self.target = Target.probe(Device(campaign.config.device))
        self.case: Case | None = None
        self.takers: dict[str, frozenset[str] | None] = {}
        self.found: dict[Signature, Found] = {}
        self.drawn = 0

    def cases(self, start: float) -> Iterator[Case]:
        """Rounds of envelope plans with fresh seeds, until the budget or the failure count says stop."""
        for round_index in itertools.count():
            plan = envelope_plan(list(self.backends.values()), self.target,
                                 self.campaign.seed + ROUND_SEEDS * round_index)
            if not plan.cases:
                raise SpecError("backends", ",".join(self.backends), "a backend that can run a case here")
            for planned in plan.cases:
                if self._done(start):
                    return
                self.takers[planned.name] = planned.backends
                self.case = build_case(planned.spec, planned.seed, self.campaign.config.device, name=planned.name)
                self.case = dataclasses.replace(self.case, meta={**self.case.meta, "families": list(planned.families)})
                self.drawn += 1
                yield self.case

    def _done(self, start: float) -> bool:
        over = time.monotonic() - start > self.campaign.budget
        enough = self.campaign.until_failures is not None and len(self.found) >= self.campaign.until_failures
        return over or enough

    def takes(self, backend: str, case: Case) -> bool:
        chosen = self.takers.get(case.name)
        return chosen is None or backend in chosen

    def heard(self, stream: ResultStream | None) -> Callable[[CaseResult], None]:
        def on_result(result: CaseResult) -> None:
            if stream:
                stream.write(result)
            if result.verdict.failed and self.case is not None:
                key = signature(result, self.case.next_n)
                if key in self.found:
                    self.found[key].seen += 1
                else:
                    origin = self.backends[result.backend].origin
                    self.found[key] = Found(key, self.case, result, origin.target or result.backend)
        return on_result


def _keep(found: Found, backend: Loaded, campaign: Campaign) -> None:
    """The found case's bundle, and its shrunk bundle where it can be probed safely."""
    if campaign.repro_dir is None:
        return
    found.bundle = write_bundle(campaign.repro_dir, found.case, found.result, campaign.config, backend.origin,
                                backend.contract.library)
    if found.result.verdict in UNSHRINKABLE or campaign.shrink_seconds == 0:
        return
    try:
        found.shrunk = shrink(found.case, backend, campaign.config, campaign.shrink_seconds)
    except SpecError:  # it no longer fails in-process (a flaky or isolation-only failure): the bundle stays
        return
    write_bundle(campaign.repro_dir, found.shrunk.case, found.shrunk.result, campaign.config, backend.origin,
                 backend.contract.library)


def render_campaign(outcome: CampaignOutcome) -> str:
    """The campaign's end: its rate, then each distinct failure with its count and its repro line."""
    lines = [f"{outcome.cases} cases in {outcome.seconds:.1f} s: {outcome.cases_per_second:.1f} cases/s; "
             f"{len(outcome.found)} distinct failures"]
    for found in outcome.found:
        lines.append(f"  {found.signature.describe()}: {found.seen} results, first {found.case.name} "
                     f"[{found.case.describe()}]")
        if found.shrunk is not None:
            lines.append(f"    shrunk: {found.shrunk.case.describe()}")
        lines.append(f"    repro: {repro_line(found)}")
    return "\n".join(lines)


def repro_line(found: Found) -> str:
    """The command that draws the (shrunk) case again: `difftest run ... --spec JSON --seed N`, else the
    replay of its bundle, else the case's description."""
    shrunk = found.shrunk
    if shrunk is not None and shrunk.spec is not None:
        spec = json.dumps(shrunk.spec.to_json(), separators=(",", ":"))
        return shlex.join(["difftest", "run", "--backends", found.target, "--spec", spec,
                           "--seed", str(shrunk.seed)])
    if found.bundle is not None:
        return shlex.join(["difftest", "replay", str(found.bundle), "--trust-bundle"])
    return found.case.describe()
