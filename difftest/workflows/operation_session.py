"""`difftest run --op X` (and `fuzz`, `replay`, `shrink`) for an operation other than paged logits, as library
calls: plan the operation's cases (each backend's envelope, or the operation's fixed suite), run them through
the operation runner (difftest.engine.operation_run), and hand every result to the outputs the paged workflows
write through (difftest.records.outputs): the stream, a bundle for every failure (a campaign: for the first
failure of each backend and verdict), the JSON report and JUnit XML. A Ctrl-C or SIGTERM (a scheduler's
`timeout`) keeps what finished in the stream and the report, marked incomplete, as a paged run does. Paged
logits keeps its own session (difftest.workflows.session). Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import random
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from difftest.backends import Loaded, get_backends
from difftest.core import hardware, memory
from difftest.core.errors import SpecError, first_line, require
from difftest.core.kinds import CaseKind, ExitStatus, OperationKind
from difftest.core.operation import Operation
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, operation_workers, relations_asked, run_one, run_operation
from difftest.engine.plan import SuiteRequest, matching
from difftest.engine.result import CaseResult
from difftest.engine.runner import NotDrawn
from difftest.operations import operation
from difftest.records.bundle import Bundle
from difftest.records.commands import operation_command
from difftest.records.outputs import (
    CAMPAIGN_FLUSH_SECONDS,
    BundleOutput,
    JUnitOutput,
    Outputs,
    ReportOutput,
    StreamOutput,
    check_outputs,
    claimed,
    run_files,
    stream_beside,
)
from difftest.records.report import config_info, environment_info
from difftest.workflows.fuzz import require_campaign
from difftest.workflows.session import untested_backends
from difftest.workflows.shrink import Failure, require_shrink_seconds
from difftest.workflows.signatures import signature

Listener = Callable[[CaseResult], None]


@dataclasses.dataclass(frozen=True)
class OperationRequest:
    """One run of an operation. Errors name these fields."""

    operation: OperationKind
    cases: CaseKind = CaseKind.ENVELOPE
    seed: int = 0
    count: int = 1  # seeds per spec
    backends: tuple[str, ...] | None = None  # what chosen_backends takes; None: every built-in one
    case_filter: tuple[str, ...] = ()  # fnmatch patterns on the planned cases' names; (): every case
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    report: Path | None = None
    stream: Path | None = None  # default: beside the report, suffix .jsonl
    junit: Path | None = None  # JUnit XML of every result, written at the end
    repro_dir: Path | None = None  # a bundle for every failing result
    budget: float | None = None  # seconds: no case is started after this much of the run has passed
    overwrite: bool = False  # replace the report and stream an earlier run left at those paths
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Valid by construction, with a paged run's checks: its seed and count (SuiteRequest's), its budget and
        backends (RunRequest's); what this host can run on is checked where the run starts."""
        SuiteRequest(cases=self.cases, count=self.count, seed=self.seed)
        require(self.budget is None or self.budget > 0, "budget", self.budget, "a number of seconds > 0")
        _require_backend_names(self.backends)
        relations_asked(operation(self.operation), self.config)

    @property
    def stream_path(self) -> Path | None:
        """Where results stream: `stream`, else beside `report`, else nowhere."""
        return stream_beside(self.report, self.stream)


@dataclasses.dataclass(frozen=True)
class OperationOutcome:
    """What a run of an operation made: every result in plan order, the run's info, what was written."""

    results: list[CaseResult]
    info: dict[str, Any]
    bundles: int = 0
    not_started: tuple[str, ...] = ()
    written: dict[str, Path] = dataclasses.field(default_factory=dict)  # what the outputs wrote, by parameter
    # (backend, case) of each failing result -> the `difftest run --op` line that draws it again (repro_lines)
    repro: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    untested: dict[str, str] = dataclasses.field(default_factory=dict)  # a backend named that ran no case -> why

    @property
    def failed(self) -> bool:
        """Whether a backend failed a case."""
        return any(r.verdict.failed for r in self.results)

    @property
    def status(self) -> ExitStatus:
        """FAILED when a backend failed a case or a backend asked for by name tested nothing, else OK (a paged
        run's rule, difftest.workflows.session.RunOutcome.status)."""
        return ExitStatus.FAILED if self.failed or self.untested else ExitStatus.OK


def _require_backend_names(backends: tuple[str, ...] | None) -> None:
    """SpecError naming backends unless they are None or distinct, non-empty names (`a,,b` and `a,a` are typos)."""
    require(backends is None or (all(backends) and len(set(backends)) == len(backends)), "backends", backends,
            "None (every backend) or distinct non-empty names")


def chosen_backends(op: Operation, names: tuple[str, ...] | None) -> list[Named]:
    """The operation's backends named (every built-in one for None), built, each with its origin: a registered
    name, 'package.module:object', the name a path loaded calls itself, an indexer's 'LOGITS+TOPK'
    (difftest.backends.registry.get_backends); SpecError naming one it cannot load."""
    return [Named(loaded.name, loaded) for loaded in get_backends(names, "backends", op.kind)]


Plan = list[tuple[Any, int, tuple[str, ...] | None]]  # (spec, seed, the backends that run it; None: every one)


def planned(op: Operation, backends: list[Named], request: OperationRequest) -> Plan:
    """(spec, seed, the backends that run it) in plan order: each available backend's envelope (a spec two
    backends plan runs once, for both; an unavailable backend takes every case, to say why it ran none), or
    the operation's fixed suite for every backend."""
    seeds = range(request.seed, request.seed + request.count)
    if request.cases != CaseKind.ENVELOPE:
        return [(spec, seed, None) for spec in op.suite() for seed in seeds]
    takers: dict[Any, list[str]] = {}
    idle = [n.name for n in backends if n.backend.unavailable_reason(request.config.device)]
    for named in backends:
        if named.name not in idle:
            for item in op.envelope(named.backend.contract, request.config.device):
                takers.setdefault(item.spec, []).append(named.name)
    return [(spec, seed, tuple(names + idle)) for spec, names in takers.items() for seed in seeds]


def execute_operation(request: OperationRequest, on_result: Listener | None = None) -> OperationOutcome:
    """Run `request`: plan, run, and hand each result to the run's outputs (stream, bundles, report, JUnit)."""
    op = operation(request.operation)
    hardware.require_device(request.config.device)  # this host's, not the request's: checked where it runs
    started = time.time()
    backends = chosen_backends(op, request.backends)
    plan = filtered(planned(op, backends, request), op, request.case_filter)
    not_started: list[str] = []

    def made() -> dict[str, Any]:
        return {**run_info(request, started, len(plan)), "not_started": not_started}

    locks = claimed(run_files(request.report, request.stream_path, request.stream is not None), request.overwrite)
    try:
        outputs = _outputs(f"difftest run --op {op.name}", request.config, run_info(request, started, len(plan)),
                           report=request.report, stream=request.stream_path, junit=request.junit,
                           repro_dir=request.repro_dir, backends=backends)
        current: list[Any] = [None]
        finished: list[CaseResult] = []

        def heard(result: CaseResult) -> None:
            outputs.take(result, current[0])
            finished.append(result)
            if on_result:
                on_result(result)

        with outputs.keeping(finished, made, resumable=False):
            results = run_operation(op, backends, _drawn(op, plan, request, started, not_started, current),
                                    request.config, heard)
        info = made()
        written = outputs.finish(results, info)
    finally:
        for lock in locks:
            lock.release()
    untested = untested_backends(backends, results, None) if request.backends else {}
    return OperationOutcome(results, info, bundles=_bundles(outputs), not_started=tuple(not_started),
                            written=written, repro=repro_lines(op, results, plan, request),
                            untested=untested)


def filtered(plan: Plan, op: Operation, globs: tuple[str, ...]) -> Plan:
    """The planned cases whose name matches one of `globs` (every one for none); SpecError naming
    `case_filter` for a glob that matches no case (a typo): difftest.engine.plan.matching, the paged plan's rule."""
    if not globs:
        return plan
    names = [op.case_name(spec, seed) for spec, seed, _ in plan]
    kept = matching(names, globs)
    return [item for item, name in zip(plan, names, strict=True) if name in kept]


def repro_lines(op: Operation, results: list[CaseResult], plan: Plan,
                request: OperationRequest) -> dict[tuple[str, str], str]:
    """(backend, case) of each failing result -> the `difftest run --op` line that draws its case again through
    that backend, with every option of the run's config (difftest.records.commands.operation_command)."""
    seeds = {op.case_name(spec, seed): seed for spec, seed, _ in plan}
    return {(r.backend, r.case): operation_command(op.kind, r.backend, request.cases, seeds[r.case], r.case,
                                                   request.config)
            for r in results if r.verdict.failed and r.case in seeds}


def _outputs(suite: str, config: RunConfig, info: dict[str, Any], report: Path | None, stream: Path | None,
             junit: Path | None, repro_dir: Path | None, backends: list[Named],
             first_of: Callable[[CaseResult], Any] | None = None, flush_seconds: float = 0.0) -> Outputs:
    """The writers of an operation's run or campaign (difftest.records.outputs), each path checked writable
    before its first case: its stream (after its run line, written in batches `flush_seconds` apart), a bundle
    per failing result recording its backend's origin (`first_of`: only the first of each key), the report, and
    JUnit XML in a suite called `suite`."""
    check_outputs({"report": report, "stream": stream, "junit": junit}, repro_dir)
    loaded = [named.backend for named in backends]
    return Outputs([StreamOutput(stream, info, flush_seconds=flush_seconds) if stream else None,
                    BundleOutput(repro_dir, config, loaded, first_of=first_of) if repro_dir else None,
                    ReportOutput(report) if report else None,
                    JUnitOutput(junit, suite) if junit else None])


def _bundles(outputs: Outputs) -> int:
    """How many bundles the outputs wrote."""
    bundles = outputs.of(BundleOutput)
    return len(bundles.written) if bundles else 0


def _drawn(op: Operation, plan: list[tuple[Any, int, tuple[str, ...] | None]], request: OperationRequest,
           started: float, left: list[str], current: list[Any]) -> Iterator[Drawn]:
    """The planned cases as tensors on the run's device, until the budget is spent (the names of those never
    started go to `left`); `current` holds the case being run, for its bundles."""
    for index, (spec, seed, takers) in enumerate(plan):
        if request.budget is not None and time.time() - started > request.budget:
            left.extend(op.case_name(s, d) for s, d, _ in plan[index:])
            return
        drawn = drawn_or_not(op, spec, seed, request.config.device, takers)
        current[0] = drawn.case
        yield drawn


def drawn_or_not(op: Operation, spec: Any, seed: int, device: str, takers: tuple[str, ...] | None = None) -> Drawn:
    """The case of (`spec`, `seed`) drawn on `device`, or, where drawing it ran out of memory (a GPU shared with
    other runs), its NotDrawn: SKIPs that say so, and the run or campaign goes on."""
    try:
        return Drawn(op.build(spec, seed, device), spec.to_json(), takers)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        name, drawn_from = op.case_name(spec, seed), spec.to_json()
        return Drawn(NotDrawn(name, name, 0, f"drawing it: {first_line(exc)}", drawn_from), drawn_from, takers)


def run_info(request: OperationRequest, started: float, cases: int) -> dict[str, object]:
    """How the run was made: the command, the operation, versions, device and options."""
    return {"command": "difftest " + shlex.join(request.argv), "operation": request.operation.value,
            "seed": request.seed, "cases": cases, "device": request.config.device, **environment_info(started),
            "seconds": round(time.time() - started, 3), **config_info(request.config),
            "cases_kind": request.cases.value, "budget": request.budget}


def replay_operation(bundle: Bundle, backend: Loaded) -> CaseResult:
    """The bundle's case through `backend` (its recorded one: difftest.workflows.replay.bundle_backend, or
    another of the operation's), on the recorded device: in a worker process when the recorded run was
    isolated, else in this process."""
    return run_one(operation(bundle.operation), Named(backend.name, backend), bundle.case, bundle.config)


@dataclasses.dataclass(frozen=True)
class OperationShrink:
    """The smallest case found that fails as the bundle's did, and its result."""

    case: Any
    result: CaseResult
    original: Any


def shrink_operation(bundle: Bundle, seconds: float, backend: Loaded) -> OperationShrink:
    """Reduce a bundle's case with its operation's shrink moves while `backend` (its recorded one, or another of
    the operation's) still fails it the way it does now, with the recorded verdict (an ERROR: the same exception
    type; a FAIL(metamorphic): the same relation violated); SpecError when it does not fail so now."""
    require_shrink_seconds(seconds)
    op = operation(bundle.operation)
    require(op.shrink is not None, "operation", op.name, "an operation with shrink moves")
    named = Named(backend.name, backend)
    with operation_workers(op, bundle.config) as workers:  # under isolation, one worker for every probe
        first = run_one(op, named, bundle.case, bundle.config, workers=workers)
        failure = Failure.of(first)
        if failure is None or failure.verdict != bundle.verdict:
            raise SpecError("bundle", str(bundle.path), f"a case that still fails with {bundle.verdict.value} (it "
                            f"gives {first.verdict.value} now)")
        # A FAIL(metamorphic) probe checks the relation it must still violate, other probes none (the oracle's
        # verdict ranks above a violation): as the paged shrink (difftest.workflows.shrink).
        probe = dataclasses.replace(bundle.config, metamorphic=(failure.relation,) if failure.relation else ())

        def still_fails(case: Any) -> bool:
            return failure.matches(run_one(op, named, case, probe, workers=workers))

        try:
            smallest = op.shrink(bundle.case, still_fails, named.backend.contract, seconds)
        except SpecError as exc:
            raise SpecError("bundle", str(bundle.path), f"a case that still fails with {bundle.verdict.value} "
                            f"({first_line(exc)})") from None
        return OperationShrink(smallest, run_one(op, named, smallest, bundle.config, workers=workers), bundle.case)


@dataclasses.dataclass(frozen=True)
class OperationCampaign:
    """A time-budgeted fuzz campaign of an operation: random specs with fresh seeds."""

    operation: OperationKind
    budget: float
    seed: int = 0
    backends: tuple[str, ...] | None = None
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    repro_dir: Path | None = None
    report: Path | None = None
    stream: Path | None = None  # every result as it is made, in batches CAMPAIGN_FLUSH_SECONDS apart
    junit: Path | None = None  # JUnit XML of every result, written at the end
    until_failures: int | None = None
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Valid by construction, with a paged campaign's checks of its budget, until_failures and seed, and a run's
        of its backends."""
        require_campaign(self.budget, self.until_failures, self.seed)
        _require_backend_names(self.backends)


def fuzz_operation(campaign: OperationCampaign, on_result: Listener | None = None) -> OperationOutcome:
    """Random specs of the operation (Operation.random_spec), each with a fresh seed, through every backend
    until the budget is spent (or `until_failures` failing results), every result handed to the campaign's
    outputs (stream, bundles, report, JUnit); under repro_dir a bundle for the first failure of each signature
    (difftest.workflows.signatures: backend, verdict and the explained pattern; a campaign repeats a failure
    thousands of times: one reproducer of each root cause is what a reader replays and shrinks)."""
    op = operation(campaign.operation)
    require(op.random_spec is not None, "operation", op.name, "an operation that draws random specs")
    hardware.require_device(campaign.config.device)  # this host's, not the campaign's: checked where it runs
    backends = chosen_backends(op, campaign.backends)
    rng, started, results = random.Random(campaign.seed), time.time(), []

    def made() -> dict[str, Any]:
        return _campaign_info(op, campaign, started)

    # Locked as run --op locks them (two campaigns into one stream interleave); a campaign replaces what an
    # earlier one left there, as a paged campaign does.
    locks = claimed(run_files(campaign.report, campaign.stream, stream_given=True), overwrite=True)
    try:
        outputs = _outputs(f"difftest fuzz --op {op.name}", campaign.config, made(), report=campaign.report,
                           stream=campaign.stream, junit=campaign.junit, repro_dir=campaign.repro_dir,
                           backends=backends, first_of=signature, flush_seconds=CAMPAIGN_FLUSH_SECONDS)

        def heard(result: CaseResult, case: Any) -> None:
            outputs.take(result, case)
            results.append(result)
            if on_result:
                on_result(result)

        with outputs.keeping(results, made, resumable=False):
            _campaign(op, backends, campaign, rng, started, results, heard)
        info = made()
        written = outputs.finish(results, info)
    finally:
        for lock in locks:
            lock.release()
    return OperationOutcome(results, info, bundles=_bundles(outputs), written=written)


def _campaign(op: Operation, backends: list[Named], campaign: OperationCampaign, rng: random.Random,
              started: float, results: list[CaseResult], heard: Callable[[CaseResult, Any], None]) -> None:
    """Draw and run random cases until the budget or `until_failures` ends the campaign."""
    with operation_workers(op, campaign.config) as workers:  # under isolation, kept from case to case
        while time.time() - started < campaign.budget:
            spec = op.random_spec(rng, campaign.config.device)
            seed = rng.randrange(1 << 31)
            try:
                drawn = drawn_or_not(op, spec, seed, campaign.config.device)
            except SpecError:  # a drawn spec the generator refuses (windows that cannot fit): draw again
                continue
            run_operation(op, backends, [drawn], campaign.config,
                          lambda result, case=drawn.case: heard(result, case), workers)
            if campaign.until_failures and sum(r.verdict.failed for r in results) >= campaign.until_failures:
                return


def _campaign_info(op: Operation, campaign: OperationCampaign, started: float) -> dict[str, object]:
    return {"command": "difftest " + shlex.join(campaign.argv), "operation": op.name, "seed": campaign.seed,
            "device": campaign.config.device, "budget": campaign.budget, **environment_info(started),
            "seconds": round(time.time() - started, 3), **config_info(campaign.config)}
