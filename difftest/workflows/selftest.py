"""`difftest selftest`: how strong is a configuration? The mutants of difftest.backends.mutants run under it, and
the score says which were caught, by which edge family or fuzz round, how soon, and why any was missed.

The cases are the envelope plan `difftest run` makes (difftest.engine.plan.envelope_plan) for the mutants'
contract: the kernel's own envelope, or with a template (a user's backend) that backend's, so the score is for that
envelope. A template of another operation (a top-k or ragged logits backend: its contract says which) scores that
operation's mutants, in its envelope. Every mutant runs the plan's cases in order under the run's config; a mutant
that must be caught stops once a case of the family it names has failed (or, where that family is not in the plan,
at its first failure): what is left would only confirm it. Then, within `budget` seconds, a fuzz round
(difftest.workflows.fuzz) of fresh seeds runs the paged mutants still uncaught and the two that must pass. The
top-k and ragged-logits mutants run the same way on their own operation's plan, in this process
(difftest.workflows.selftest_operations), and have no fuzz round. Without the plan (plan=False) the fuzz round runs
every paged mutant, and the paged score is the campaign's alone: a catch by any family counts.

A miss is explained from the plan: the family that would have reached it was left out (the plan's own
reason), or what the mutant needs is not in the envelope (draft rows, a second head group, a judged tail,
production scale); or from the results: a case of that family was a SKIP (out of memory on a shared device),
so the mutant earned no verdict there. Only a miss the plan could have caught fails the selftest: the status
is OK when every expected catch happened, by the family named, and the correct and the nondeterministic
mutants passed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from difftest.backends import Loaded, Origin, load_of_any_operation
from difftest.backends import mutants as catalogue
from difftest.core.contract import Contract
from difftest.core.errors import require
from difftest.core.files import check_writable
from difftest.core.kinds import Device, ExitStatus, OperationKind
from difftest.core.triton_interpret import environ
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.plan import EnvelopePlan, PlannedCase, envelope_plan, filtered
from difftest.engine.result import CaseResult
from difftest.generators.envelope import EdgeFamily, Scale, Target
from difftest.generators.regime import Regime
from difftest.records.report import config_info, environment_info, render_reach, write_json
from difftest.records.score import MutantScore, SelftestScore, Status
from difftest.workflows import fuzz
from difftest.workflows.running import run
from difftest.workflows.selftest_operations import (
    OperationTally,
    Progress,
    first_failure,
    operation_envelope,
    run_operations,
)
from difftest.workflows.session import drawn_or_not

PAGED = OperationKind.PAGED_LOGITS
FUZZ_SEED_OFFSET = 7_000_000  # the fuzz round's seeds start past the plan's (fuzz.ROUND_SEEDS apart per round)


@dataclasses.dataclass(frozen=True)
class SelftestRequest:
    """What a selftest is asked to do. Errors name these fields."""

    config: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(repeat=2))
    template: str | None = None  # a backend whose envelope its operation's mutants take: a name or 'pkg.mod:obj'
    budget: float | None = None  # seconds of the fuzz round after the plan; None: no fuzz round
    seed: int = 0
    mutants: tuple[str, ...] | None = None  # catalogue keys (or names); None: every kernel mutant
    regime: Regime = dataclasses.field(default_factory=Regime)  # bounds on the fuzz round's cases
    case_filter: tuple[str, ...] = ()  # fnmatch patterns on the plan's case names
    plan: bool = True  # False: no planned paged cases, the score is the fuzz round's alone (budget needed)
    report: Path | None = None
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require(self.budget is None or self.budget > 0, "budget", self.budget, "a number of seconds > 0")
        require(self.plan or self.budget is not None, "budget", self.budget,
                "a fuzz round's seconds when the plan is not run")
        require(self.config.repeat >= 2, "repeat", self.config.repeat,
                "at least 2 launches per case: the nondeterministic mutant's launches must be compared")


@dataclasses.dataclass(frozen=True)
class SelftestOutcome:
    """The score, every result it rests on, and the plan they came from."""

    scores: list[MutantScore]
    results: list[CaseResult]
    plan: EnvelopePlan
    contract: Any  # the contract of the template's operation's mutants, in its envelope (default: paged logits')
    template: str | None
    seconds: float
    fuzz_seconds: float | None = None  # the fuzz round's, when there was one
    written: Path | None = None

    @property
    def status(self) -> ExitStatus:
        """OK when every mutant did what was expected of it here, else FAILED."""
        return ExitStatus.OK if all(score.ok for score in self.scores) else ExitStatus.FAILED

    def summary(self) -> str:
        """'14 of 16 mutants caught (2 not reachable here), 2 of 2 that must pass passed: OK'."""
        bugs = [s for s in self.scores if s.expected != "pass"]
        caught = sum(s.status == Status.CAUGHT for s in bugs)
        unreachable = [s for s in bugs if s.status == Status.MISSED and not s.expected_here]
        production = sum(s.production_only for s in unreachable)
        passing = [s for s in self.scores if s.expected == "pass"]
        passed = sum(s.status == Status.PASSED for s in passing)
        verdict = "OK" if self.status == ExitStatus.OK else "FAILED"
        return (f"mutation score: {caught} of {len(bugs)} mutants caught ({len(unreachable)} not reachable here, "
                f"{production} of them production-only), {passed} of {len(passing)} that must pass passed, in "
                f"{self.seconds:.1f} s: {verdict}")


def selftest(request: SelftestRequest, progress: Progress | None = None) -> SelftestOutcome:
    """Run the mutants under `request`: the envelope plan, then the fuzz round within its budget; the score.
    `progress` hears a line as each mutant first fails (a long GPU run says what it has found so far)."""
    start = time.monotonic()
    if request.report is not None:
        check_writable(request.report, "report")
    template = load_of_any_operation(request.template, "backend_template").contract if request.template else None
    kind = PAGED if template is None else template.operation
    specs = _chosen(request.mutants, kind)
    paged_template = request.template if kind == PAGED else None
    with environ(catalogue.TEMPLATE_ENV, paged_template or ""):  # how a worker rebuilds the mutants
        contract = catalogue.envelope_of(template if kind == PAGED else None)
        backends = {spec.key: _loaded(spec, contract) for spec in specs if spec.operation == PAGED}
        target = Target.probe(Device(request.config.device))
        plan = envelope_plan(list(backends.values()), target, request.seed)
        cases = _planned(plan, request)
        tally = _Tally(specs, cases, start, progress)
        results = run(list(backends.values()), _drawn(cases, request.config.device, tally), request.config,
                      on_result=tally.heard, takes=tally.takes) if backends else []
        fuzz_seconds = _fuzz_round(request, tally, backends) if request.budget and backends else None
    operations = run_operations(specs, target, request.config, request.seed, start, progress,
                                template if kind != PAGED else None)
    scores = [_score(spec, tally, plan, cases, contract, target, request) if spec.operation == PAGED
              else _operation_score(spec, operations[spec.operation]) for spec in specs]
    shown = contract if kind == PAGED or template is None else operation_envelope(kind, template)
    outcome = SelftestOutcome(scores, results + tally.fuzz_results, plan, shown, request.template,
                              time.monotonic() - start, fuzz_seconds)
    if request.report is None:
        return outcome
    written = write_json(request.report, outcome.results, selftest_info(request, outcome), score_section(outcome))
    return dataclasses.replace(outcome, written=written)


def _planned(plan: EnvelopePlan, request: SelftestRequest) -> list[PlannedCase]:
    """The plan's cases the paged mutants run: none for a fuzz-round-only score, else those the filter keeps."""
    if not request.plan:
        return []
    return filtered(plan.cases, request.case_filter) if request.case_filter else plan.cases


def _chosen(keys: tuple[str, ...] | None, kind: OperationKind = PAGED) -> list[catalogue.MutantSpec]:
    """The catalogue entries named (by key, dashed or not, or by backend name), in catalogue order; every one
    when None. A template of an operation other than paged logits (`kind`) scores that operation's mutants
    alone: they are its default, and another operation's named is a SpecError."""
    own = [spec for spec in catalogue.CATALOGUE if kind == PAGED or spec.operation == kind]
    if keys is None:
        return own
    wanted = {key.removeprefix(catalogue.PREFIX).replace("-", "_") for key in keys}
    unknown = sorted(wanted - set(catalogue.BY_KEY))
    require(not unknown, "mutants", ",".join(unknown), f"catalogue keys among {sorted(catalogue.BY_KEY)}")
    foreign = sorted(key for key in wanted if catalogue.BY_KEY[key] not in own)
    require(not foreign, "mutants", ",".join(foreign), f"mutants of the {kind.value} operation, whose backend the "
            f"template is: {[spec.key for spec in own]}")
    return [spec for spec in own if spec.key in wanted]


def _loaded(spec: catalogue.MutantSpec, contract: Contract) -> Loaded:
    """The mutant as a backend a worker rebuilds from its module attribute (and TEMPLATE_ENV)."""
    return Loaded(catalogue.TritonMutant(spec, contract), Origin(f"{catalogue.__name__}:{spec.key}", registered=False))


def _drawn(cases: list[PlannedCase], device: str, tally: _Tally) -> Iterator[Any]:
    """The planned cases drawn in order (a NotDrawn where drawing ran out of memory: SKIPs, which score
    nothing); those no mutant still runs are not drawn at all."""
    for planned in cases:
        if any(tally.wants(name, planned.name) for name in tally.names):
            yield drawn_or_not(planned, device)


class _Tally:
    """What the selftest knows as results come: each mutant's cases run, failures, first failure and its time."""

    def __init__(self, specs: list[catalogue.MutantSpec], cases: list[PlannedCase], start: float,
                 progress: Progress | None = None) -> None:
        self.progress = progress
        self.specs = {spec.name: spec for spec in specs if spec.operation == PAGED}
        self.names = list(self.specs)
        self.start = start
        self.planned = {case.name: case for case in cases}
        self.ran: dict[str, int] = dict.fromkeys(self.names, 0)
        self.failures: dict[str, list[tuple[CaseResult, tuple[str, ...]]]] = {name: [] for name in self.names}
        # SKIPs (a case that ran out of memory being drawn or called), with their cases' families
        self.skipped: dict[str, list[tuple[CaseResult, tuple[str, ...]]]] = {name: [] for name in self.names}
        self.first: dict[str, float] = {}
        self.fuzz_results: list[CaseResult] = []
        self.fuzz_families: dict[str, set[str]] = {name: set() for name in self.names}  # families each ran
        self.fuzz_first: dict[str, float] = {}  # seconds to each mutant's first failing result in the round
        # The families each mutant's expectation can be met by in this plan: where its family has cases.
        planned_families = {f for case in cases for f in case.families}
        self.expecting = {name: spec.caught_by.value for name, spec in self.specs.items()
                          if isinstance(spec.caught_by, EdgeFamily) and spec.caught_by.value in planned_families}

    def wants(self, name: str, case: str) -> bool:
        """Whether mutant `name` still runs: one that must pass runs every case; another until a case of its
        expected family failed (its first failure, where that family has no case here)."""
        spec = self.specs[name]
        if spec.must_pass or not self.failures[name]:
            return self._planned_for(name, case)
        expected = self.expecting.get(name)
        done = expected is None or any(expected in families for _result, families in self.failures[name])
        return not done and self._planned_for(name, case)

    def _planned_for(self, name: str, case: str) -> bool:
        planned = self.planned.get(case)
        return planned is None or planned.backends is None or name in planned.backends

    def takes(self, name: str, case: Any) -> bool:
        """The runner's question, per backend and case as each case comes."""
        return self.wants(name, case.name)

    def heard(self, result: CaseResult) -> None:
        """A result of the plan's pass."""
        planned = self.planned.get(result.case)
        families = tuple(planned.families) if planned is not None else ()
        if result.verdict == Verdict.SKIP:
            self.skipped[result.backend].append((result, families))
            return
        self.ran[result.backend] += 1
        if result.verdict.failed:
            self._failed(result, families)

    def _failed(self, result: CaseResult, families: tuple[str, ...]) -> None:
        self.failures[result.backend].append((result, families))
        if result.backend not in self.first:
            now = time.monotonic() - self.start
            self.first[result.backend] = self.fuzz_first.get(result.backend, now)
            if self.progress is not None:
                self.progress(first_failure(result.backend, result.verdict, result.case, families,
                                            self.first[result.backend]))

    def fuzz_heard(self, result: CaseResult) -> None:
        """A fuzz round's result as it comes: when each mutant first failed (the round's outcome, at its end,
        is what counts)."""
        if result.verdict.failed and result.backend in self.specs:
            self.fuzz_first.setdefault(result.backend, time.monotonic() - self.start)

    def fuzzed(self, results: list[CaseResult]) -> None:
        """The fuzz round's results: a failure counts as caught by 'fuzz' and its case's families."""
        self.fuzz_results = results
        for result in results:
            if result.backend not in self.specs:
                continue
            reached = tuple(result.reach.families) if result.reach else ()
            if result.verdict == Verdict.SKIP:
                self.skipped[result.backend].append((result, reached))
                continue
            self.ran[result.backend] += 1
            self.fuzz_families[result.backend].update(reached)
            if result.verdict.failed:
                self._failed(result, (*reached, catalogue.FUZZ))


def _fuzz_round(request: SelftestRequest, tally: _Tally, backends: dict[str, Loaded]) -> float:
    """The mutants still uncaught and those that must pass, in a fuzz campaign of `budget` seconds."""
    names = [name for name in tally.names if tally.specs[name].must_pass or not tally.failures[name]]
    if not names:
        return 0.0
    keys = [tally.specs[name].key for name in names]
    campaign = fuzz.Campaign(budget=float(request.budget or 0), backends=tuple(
        f"{catalogue.__name__}:{key}" for key in keys), config=request.config, seed=request.seed + FUZZ_SEED_OFFSET,
        shrink_seconds=0, regime=request.regime, batching=not request.config.metamorphic)
    outcome = fuzz.fuzz(campaign, on_result=tally.fuzz_heard)
    tally.fuzzed(outcome.results)
    return outcome.phases.total if outcome.phases else outcome.seconds


# --------------------------------------------------------------------------- the score

def _score(spec: catalogue.MutantSpec, tally: _Tally, plan: EnvelopePlan, cases: list[PlannedCase],
           contract: Contract, target: Target, request: SelftestRequest) -> MutantScore:
    """A paged mutant's row: what happened to it and whether that is what was expected here. Without the
    plan, the fuzz round is expected to catch every mutant its envelope and scale can reach, by any family."""
    fuzzed = request.budget is not None
    if spec.must_pass:
        unreachable = None
    elif request.plan:
        unreachable = _unreachable(spec, plan, cases, contract, target, fuzzed) or _skipped(spec, tally)
    else:
        unreachable = _out_of_reach(spec, contract, target) or _skipped(spec, tally) or _not_run(spec, tally)
    return _scored(spec, tally.failures[spec.name], tally.ran[spec.name], tally.first.get(spec.name), unreachable,
                   family_required=request.plan)


def _operation_score(spec: catalogue.MutantSpec, tally: OperationTally) -> MutantScore:
    """A top-k or ragged mutant's row: as a paged one's, a miss explained by its family's omission from its
    operation's plan, or by that family's cases being SKIPs."""
    family = spec.caught_by.value  # type: ignore[union-attr]
    left = tally.omitted(family)
    unreachable = (None if spec.must_pass else _skipped(spec, tally) if family in tally.families
                   else f"{family} left out: {left}" if left else f"{family}: no case of the {tally.kind.value} plan")
    return _scored(spec, tally.failures[spec.name], tally.ran[spec.name], tally.first.get(spec.name), unreachable)


def _scored(spec: catalogue.MutantSpec, failures: list[tuple[Any, tuple[str, ...]]], ran: int,
            first_seconds: float | None, unreachable: str | None, family_required: bool = True) -> MutantScore:
    """`spec`'s row from its failures (each a result, or anything with its case, verdict and reason, and the
    families of its case), the cases it ran, and why its family could not reach it here (None: it could).
    `family_required`: a catch counts as expected only when a case of the expected family made it (a
    fuzz-round-only score takes a catch by any family)."""
    expected = "pass" if spec.must_pass else getattr(spec.caught_by, "value", spec.caught_by)
    seen = dict(mutant=spec.name, bug_class=spec.bug_class.value, expected=expected,
                production_only=spec.production_only, cases=ran, seconds=first_seconds,
                caught_by=_families_caught(failures, expected),
                first_case=failures[0][0].case if failures else None,
                first_verdict=failures[0][0].verdict.value if failures else None)
    if spec.must_pass:
        if failures:
            result = failures[0][0]
            return MutantScore(**seen, status=Status.FALSE_POSITIVE, expected_here=True, ok=False,
                               why=f"{result.verdict.value} on {result.case}: {result.reason or 'see its result'}")
        return MutantScore(**seen, status=Status.PASSED, expected_here=True, ok=True)
    if failures:
        off = family_required and unreachable is None and expected not in seen["caught_by"]
        why = (f"expected {expected}, whose cases did not fail it" if off
               else f"{expected} not reached here ({unreachable})" if unreachable else "")
        return MutantScore(**seen, status=Status.CAUGHT, expected_here=unreachable is None, ok=not off, why=why)
    if unreachable is not None:
        return MutantScore(**seen, status=Status.MISSED, expected_here=False, ok=True, why=unreachable)
    why = (f"{expected} reached, and none of its cases failed it" if family_required
           else f"the fuzz round's {ran} cases did not fail it")
    return MutantScore(**seen, status=Status.MISSED, expected_here=True, ok=False, why=why)


def _families_caught(failures: list[tuple[Any, tuple[str, ...]]], expected: str) -> tuple[str, ...]:
    """The families of the failing cases, the expected one first."""
    families = sorted({f for _result, families in failures for f in families})
    return tuple(sorted(families, key=lambda f: f != expected))


def _out_of_reach(spec: catalogue.MutantSpec, contract: Contract, target: Target) -> str | None:
    """Why no fuzz case here can reach `spec`'s bug (outside the envelope, or production scale on a small
    target); None when one can."""
    unmet = catalogue.unmet(spec, contract)
    if unmet:
        return "not in the envelope: " + "; ".join(unmet)
    if spec.production_only and target.scale == Scale.SMALL:
        return f"needs production scale; this is a {target.scale.value}-scale run"
    return None


def _skipped(spec: catalogue.MutantSpec, tally: _Tally | OperationTally) -> str | None:
    """Why the family that reaches `spec`'s bug may not have here: cases of it were SKIPs (out of memory being
    drawn or called, on a device shared with other runs), and none of it failed the mutant. A miss so
    explained is no weakness of the configuration: those cases earned no verdict. None when no case of the
    family was skipped, or one of it failed the mutant."""
    family = getattr(spec.caught_by, "value", None)
    if family is None or any(family in families for _result, families in tally.failures[spec.name]):
        return None
    skips = [result for result, families in tally.skipped[spec.name] if family in families]
    if not skips:
        return None
    return f"{family}: {len(skips)} of its cases skipped here, the first {skips[0].case}: {skips[0].reason}"


def _not_run(spec: catalogue.MutantSpec, tally: _Tally) -> str | None:
    """Why a fuzz round alone could not have been expected to catch `spec`: it ran no case of the family that
    reaches the bug (a large family left out for the memory free then, or not drawn in a short round); None
    when it did, or when any case can reach it."""
    family = getattr(spec.caught_by, "value", None)
    if family is None or family == EdgeFamily.RANDOM.value or family in tally.fuzz_families[spec.name]:
        return None
    return f"{family}: the fuzz round ran no case of it (of {tally.ran[spec.name]} cases)"


def _unreachable(spec: catalogue.MutantSpec, plan: EnvelopePlan, cases: list[PlannedCase], contract: Contract,
                 target: Target, fuzzed: bool) -> str | None:
    """Why no case here can reach `spec`'s bug as its family would; None when one can."""
    unmet = catalogue.unmet(spec, contract)
    if unmet:
        return "not in the envelope: " + "; ".join(unmet)
    if spec.caught_by == catalogue.FUZZ:
        return None if fuzzed else "left to the fuzz round, and none was run (no budget)"
    family = spec.caught_by.value  # type: ignore[union-attr]
    if any(family in case.families for case in cases):
        return None
    if any(family in case.families for case in plan.cases):
        return f"{family}: its cases left out by the case filter"
    left = [reason for f, reason in plan.omitted.get(spec.name, []) if f == family]
    if left:
        return f"{family} left out: {left[0]}"
    if spec.production_only and target.scale == Scale.SMALL:
        return f"{family} needs production scale; this is a {target.scale.value}-scale run"
    return f"{family}: no case of the plan"


def score_section(outcome: SelftestOutcome) -> SelftestScore:
    """The report's `selftest` section: the summary line, the template, and every mutant's row."""
    return SelftestScore(summary=outcome.summary(), status="OK" if outcome.status == ExitStatus.OK else "FAILED",
                         template=outcome.template, envelope=outcome.contract.library,
                         seconds=round(outcome.seconds, 3),
                         fuzz_seconds=None if outcome.fuzz_seconds is None else round(outcome.fuzz_seconds, 3),
                         mutants=list(outcome.scores))


def selftest_info(request: SelftestRequest, outcome: SelftestOutcome) -> dict[str, Any]:
    """The report's run info: the command, versions, the config the mutants ran under, the plan's omissions."""
    started = time.time() - outcome.seconds
    omitted = {name: [{"family": f, "reason": r} for f, r in left] for name, left in outcome.plan.omitted.items()}
    return {"command": "difftest " + " ".join(request.argv) if request.argv else None, "seed": request.seed,
            "cases": len(outcome.plan.cases), "device": request.config.device, **environment_info(started),
            "seconds": round(outcome.seconds, 3), **config_info(request.config), "budget": request.budget,
            "plan": {"omitted": omitted, "idle": outcome.plan.idle, "cases": len(outcome.plan.cases)}}


def render_scores(outcome: SelftestOutcome) -> str:
    """The score as a table (each mutant's row, then how it was caught or why it was missed), then the summary."""
    rows = [("mutant", "class", "expected", "result", "caught by", "time")]
    details: list[list[str]] = [[]]
    for s in outcome.scores:
        caught = ", ".join(s.caught_by[:2]) + (f" +{len(s.caught_by) - 2}" if len(s.caught_by) > 2 else "")
        rows.append((s.mutant, s.bug_class, s.expected, s.status.value + ("" if s.ok else " (!)"), caught or "-",
                     f"{s.seconds:.1f} s" if s.seconds is not None else "-"))
        lines = [f"first: {s.first_verdict} on {s.first_case}"] if s.first_case and s.status == Status.CAUGHT else []
        details.append(lines + ([("production-only: " if s.production_only else "") + s.why] if s.why else []))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row, notes in zip(rows, details, strict=True):
        lines.append(" ".join(f"{cell:<{w}}" for cell, w in zip(row[:-1], widths, strict=False))
                     + f" {row[-1]:>{widths[-1]}}")
        lines += [f"    {text}" for text in notes]
    return "\n".join([*lines, "", outcome.summary()])


def render_left_out(outcome: SelftestOutcome) -> str:
    """How far each mutant went into the envelope (the reach table), then what the plan left out and why, once:
    every mutant shares one envelope."""
    table = render_reach(outcome.results).splitlines()
    left = {family: reason for left_out in outcome.plan.omitted.values() for family, reason in left_out}
    reached = {f for case in outcome.plan.cases for f in case.families}
    lines = [f"  {family} left out: {reason}" for family, reason in sorted(left.items()) if family not in reached]
    return "\n".join(table + (["", "the plan (every mutant's):", *lines] if lines else []))
