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

from difftest.core import memory
from difftest.core.errors import SpecError, first_line, require
from difftest.core.kinds import CaseKind, OperationKind
from difftest.core.operation import Operation
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, operation_workers, relations_asked, run_one, run_operation
from difftest.engine.result import CaseResult
from difftest.engine.runner import NotDrawn
from difftest.operations import operation
from difftest.records.bundle import Bundle
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
from difftest.workflows.shrink import Failure
from difftest.workflows.signatures import signature

Listener = Callable[[CaseResult], None]


@dataclasses.dataclass(frozen=True)
class OperationRequest:
    """One run of an operation. Errors name these fields."""

    operation: OperationKind
    cases: CaseKind = CaseKind.ENVELOPE
    seed: int = 0
    count: int = 1  # seeds per spec
    backends: tuple[str, ...] | None = None  # names of the operation's backends; None: every one
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    report: Path | None = None
    stream: Path | None = None  # default: beside the report, suffix .jsonl
    junit: Path | None = None  # JUnit XML of every result, written at the end
    repro_dir: Path | None = None  # a bundle for every failing result
    budget: float | None = None  # seconds: no case is started after this much of the run has passed
    overwrite: bool = False  # replace the report and stream an earlier run left at those paths
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require(self.count >= 1, "count", self.count, "an integer >= 1")
        require(self.budget is None or self.budget > 0, "budget", self.budget, "a number of seconds > 0")
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

    @property
    def failed(self) -> bool:
        """Whether a backend failed a case."""
        return any(r.verdict.failed for r in self.results)


def chosen_backends(op: Operation, names: tuple[str, ...] | None) -> list[Named]:
    """The operation's backends named (every one for None), built; SpecError naming one it does not have."""
    table = op.backends()
    for name in names or ():
        require(name in table, "backends", name, f"a backend of the {op.name} operation: {sorted(table)}")
    return [Named(name, table[name]()) for name in (names or tuple(table))]


def planned(op: Operation, backends: list[Named], request: OperationRequest) -> list[tuple[Any, int, tuple[str, ...]
                                                                                         | None]]:
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
    started = time.time()
    backends = chosen_backends(op, request.backends)
    plan = planned(op, backends, request)
    not_started: list[str] = []

    def made() -> dict[str, Any]:
        return {**run_info(request, started, len(plan)), "not_started": not_started}

    locks = claimed(run_files(request.report, request.stream_path, request.stream is not None), request.overwrite)
    try:
        outputs = _outputs(f"difftest run --op {op.name}", request.config, run_info(request, started, len(plan)),
                           report=request.report, stream=request.stream_path, junit=request.junit,
                           repro_dir=request.repro_dir)
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
    return OperationOutcome(results, info, bundles=_bundles(outputs), not_started=tuple(not_started),
                            written=written)


def _outputs(suite: str, config: RunConfig, info: dict[str, Any], report: Path | None, stream: Path | None,
             junit: Path | None, repro_dir: Path | None, first_of: Callable[[CaseResult], Any] | None = None,
             flush_seconds: float = 0.0) -> Outputs:
    """The writers of an operation's run or campaign (difftest.records.outputs), each path checked writable
    before its first case: its stream (after its run line, written in batches `flush_seconds` apart), a bundle
    per failing result (`first_of`: only the first of each key), the report, and JUnit XML in a suite called
    `suite`."""
    check_outputs({"report": report, "stream": stream, "junit": junit}, repro_dir)
    return Outputs([StreamOutput(stream, info, flush_seconds=flush_seconds) if stream else None,
                    BundleOutput(repro_dir, config, first_of=first_of) if repro_dir else None,
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


def bundle_backend(bundle: Bundle, name: str | None = None) -> Named:
    """The backend a bundle of an operation was recorded with (or `name`, another of the operation's)."""
    op = operation(bundle.operation)
    return chosen_backends(op, (name or bundle.backend,))[0]


def replay_operation(bundle: Bundle, name: str | None = None) -> CaseResult:
    """The bundle's case through its backend (or `name`), on the recorded device: in a worker process when the
    recorded run was isolated, else in this process."""
    return run_one(operation(bundle.operation), bundle_backend(bundle, name), bundle.case, bundle.config)


@dataclasses.dataclass(frozen=True)
class OperationShrink:
    """The smallest case found that fails as the bundle's did, and its result."""

    case: Any
    result: CaseResult
    original: Any


def shrink_operation(bundle: Bundle, seconds: float, name: str | None = None) -> OperationShrink:
    """Reduce a bundle's case with its operation's shrink moves while its backend still fails it the way it does
    now, with the recorded verdict (an ERROR: the same exception type; a FAIL(metamorphic): the same relation
    violated); SpecError when it does not fail so now."""
    op = operation(bundle.operation)
    require(op.shrink is not None, "operation", op.name, "an operation with shrink moves")
    named = bundle_backend(bundle, name)
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


def fuzz_operation(campaign: OperationCampaign, on_result: Listener | None = None) -> OperationOutcome:
    """Random specs of the operation (Operation.random_spec), each with a fresh seed, through every backend
    until the budget is spent (or `until_failures` failing results), every result handed to the campaign's
    outputs (stream, bundles, report, JUnit); under repro_dir a bundle for the first failure of each signature
    (difftest.workflows.signatures: backend, verdict and the explained pattern; a campaign repeats a failure
    thousands of times: one reproducer of each root cause is what a reader replays and shrinks)."""
    op = operation(campaign.operation)
    require(op.random_spec is not None, "operation", op.name, "an operation that draws random specs")
    backends = chosen_backends(op, campaign.backends)
    rng, started, results = random.Random(campaign.seed), time.time(), []

    def made() -> dict[str, Any]:
        return _campaign_info(op, campaign, started)

    outputs = _outputs(f"difftest fuzz --op {op.name}", campaign.config, made(), report=campaign.report,
                       stream=campaign.stream, junit=campaign.junit, repro_dir=campaign.repro_dir,
                       first_of=signature, flush_seconds=CAMPAIGN_FLUSH_SECONDS)

    def heard(result: CaseResult, case: Any) -> None:
        outputs.take(result, case)
        results.append(result)
        if on_result:
            on_result(result)

    with outputs.keeping(results, made, resumable=False):
        _campaign(op, backends, campaign, rng, started, results, heard)
    info = made()
    written = outputs.finish(results, info)
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
