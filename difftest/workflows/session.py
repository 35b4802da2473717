"""One `difftest run`, as a library call: plan the cases, run them (here or spread over GPUs),
stream and keep every result, write bundles for failures and the JSON report.

The CLI builds a RunRequest from its options and prints what execute() returns; nothing here prints.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from difftest.backends import Loaded, get_backends
from difftest.core import hardware, lifetime, memory
from difftest.core.case import Case
from difftest.core.errors import Interrupted, first_line, require
from difftest.core.files import OutputLock
from difftest.core.kinds import CaseKind, Device, ExitStatus
from difftest.core.schema import refuse_link
from difftest.core.verdict import Verdict
from difftest.engine import performance
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Named
from difftest.engine.plan import EnvelopePlan, PlannedCase, Shard, SuiteRequest, envelope_plan, kept_results, plan
from difftest.engine.result import CaseResult, Reach
from difftest.engine.runner import NotDrawn
from difftest.generators.envelope import Target, estimate_bytes, spec_shape
from difftest.generators.graph_family import captured_name
from difftest.records.bundle import bundle_name
from difftest.records.commands import backend_target, run_command
from difftest.records.ledger import Ledger
from difftest.records.outputs import (
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
from difftest.records.serialize import is_stream, load_results, load_run_info
from difftest.workflows import spread
from difftest.workflows.running import run


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """Everything one run is asked to do. Errors name these fields."""

    suite: SuiteRequest = dataclasses.field(default_factory=SuiteRequest)
    backends: tuple[str, ...] | None = None  # registered names or 'pkg.mod:obj'; None: every registered one
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    report: Path | None = None
    stream: Path | None = None  # default: beside the report, suffix .jsonl
    junit: Path | None = None  # JUnit XML of every result, written at the end
    resume: Path | None = None  # a report or stream of an earlier run of the same cases
    repro_dir: Path | None = None  # a bundle for every failing result
    gpus: int | None = None  # spread over this many GPUs, one child process each
    budget: float | None = None  # seconds: no case is started after this much of the run has passed
    argv: tuple[str, ...] = ()  # the `run` command line: recorded, and what the children of a spread run get
    overwrite: bool = False  # replace the report and stream an earlier run left at those paths
    fail_slow: bool = False  # a timed backend slower than its sibling by more than it allows fails the run
    ledger: Ledger | None = None  # known divergences: the failures it expects do not fail the run

    def __post_init__(self) -> None:
        """Valid by construction: what execute() relies on is checked here, once."""
        require(self.budget is None or self.budget > 0, "budget", self.budget, "a number of seconds > 0")
        require(not self.fail_slow or self.config.time is not None, "fail_slow", True,
                "timed launches to compare (time=K, --time K)")
        require(self.backends is None or all(self.backends), "backends", self.backends,
                "None (every registered backend) or non-empty names")
        if self.gpus is not None:
            self.require_spreadable()

    def require_spreadable(self) -> None:
        """SpecError unless the run can be spread over child processes: a spread run neither resumes nor
        is a shard (it shards itself)."""
        require(self.resume is None, "resume", str(self.resume),
                "a run that is not spread (resume a spread run's report or stream on one GPU)")
        require(self.suite.shard is None, "shard", str(self.suite.shard),
                "a run that is not spread (a spread run shards itself)")

    @property
    def stream_path(self) -> Path | None:
        """Where results stream: `stream`, else beside `report`, else nowhere."""
        return stream_beside(self.report, self.stream)


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What a run made: every result in plan order, the run's info, and where things were written."""

    results: list[CaseResult]
    info: dict[str, Any]
    plan: EnvelopePlan | None = None  # what an envelope suite planned and left out
    bundles: int = 0
    stream: Path | None = None
    shards: tuple[spread.ShardRun, ...] = ()
    notes: tuple[str, ...] = ()  # what the run did that its caller should hear (a stale lock taken over)
    # a backend asked for by name that ran no case -> why
    untested: dict[str, str] = dataclasses.field(default_factory=dict)
    fail_slow: bool = False  # RunRequest.fail_slow: a slow sibling (difftest.engine.performance) fails the run
    ledger: Ledger | None = None  # RunRequest.ledger: which failures are expected, which passes are not
    # (backend, case) of each failing result -> the `difftest run` line that draws its case again
    repro: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    written: dict[str, Path] = dataclasses.field(default_factory=dict)  # what the outputs wrote, by parameter

    @property
    def status(self) -> ExitStatus:
        """FAILED when a backend failed (with a ledger: a failure it does not expect, or a pass a strict entry
        covers), a shard died, a backend asked for by name tested nothing or (with fail_slow) a backend
        was slower than its sibling by more than it allows, else OK."""
        died = any(shard.died for shard in self.shards) or bool(self.untested)
        slow = self.fail_slow and bool(performance.slow(performance.races(self.results)))
        failed = self.ledger.unexpected(self.results) if self.ledger else [r for r in self.results if r.verdict.failed]
        return ExitStatus.FAILED if died or slow or failed else ExitStatus.OK


Listener = Callable[[CaseResult], None]


def execute(request: RunRequest, on_result: Listener | None = None,
            shard_envs: list[dict[str, str]] | None = None,
            on_planned: Callable[[int], None] | None = None) -> RunOutcome:
    """Run `request`. With `gpus` (or `shard_envs`: what each child's environment adds, how the tests
    spread a CPU run) the plan is spread over child processes, one shard each. `on_planned` hears how
    many results this process will make (those --resume keeps not counted) before the first one, and
    `on_result` each one as it is made."""
    spread.join_parent()  # a shard of a spread run dies with its parent
    lifetime.sweep()  # the temporary folders of runs killed with SIGKILL
    hardware.require_device(request.config.device)  # this host's, not the request's: checked where it runs
    backends = get_backends(list(request.backends) if request.backends else None)
    planned = _envelope(request, backends)
    cases = planned.narrowed(request.suite) if planned else _fitting(plan(request.suite), request.config.device)
    if shard_envs is None and request.gpus is not None:
        shard_envs = spread.gpu_environments(request.gpus, request.config.device, torch.cuda.device_count(),
                                             os.environ.get("CUDA_VISIBLE_DEVICES"))
    planned_info = {"plan": _plan_info(planned)} if planned else {}
    locks = _claimed(request)
    try:
        if shard_envs is not None:
            outcome = _spread(request, backends, cases, shard_envs, planned_info)
        else:
            outcome = _here(request, backends, cases, on_result, planned_info, on_planned)
    finally:
        for lock in locks:
            lock.release()
    # A shard's share of the plan may leave a backend out: the whole run (a spread parent) judges it.
    named = request.backends and request.suite.shard is None
    untested = untested_backends(backends, outcome.results, planned) if named else {}
    return dataclasses.replace(outcome, plan=planned, notes=tuple(lock.note for lock in locks if lock.note),
                               untested=untested, fail_slow=request.fail_slow, ledger=request.ledger,
                               repro=repro_lines(outcome.results, cases, backends, request.config))


def repro_lines(results: list[CaseResult], cases: list[PlannedCase], backends: list[Loaded],
                config: RunConfig) -> dict[tuple[str, str], str]:
    """(backend, case) of each failing result -> the `difftest run` line that draws its case again through
    that backend, with every option of `config` (difftest.records.commands)."""
    planned = {c.name: c for c in cases}
    targets = {b.name: backend_target(b.origin, b.name) for b in backends}
    drawn = {r.case: planned.get(captured_name(r.case)) for r in results}  # a graph replay's: its captured case's
    return {(r.backend, r.case): run_command(targets[r.backend], drawn[r.case].spec, drawn[r.case].seed, config)
            for r in results if r.verdict.failed and drawn[r.case] is not None and r.backend in targets}


def untested_backends(backends: Sequence[Loaded | Named], results: list[CaseResult],
                      planned: EnvelopePlan | None) -> dict[str, str]:
    """The backends that ran no case (every result a SKIP, or none at all), each with why: a backend the
    caller asked for by name that tests nothing must not pass as green (a paged run's and an operation's)."""
    ran = {r.backend for r in results if r.verdict != Verdict.SKIP}
    skipped = {r.backend: r.reason for r in results if r.verdict == Verdict.SKIP and r.reason}
    idle = planned.idle if planned else {}
    return {b.name: idle.get(b.name) or skipped.get(b.name) or "no case of the plan was given to it"
            for b in backends if b.name not in ran}


def _claimed(request: RunRequest) -> list[OutputLock]:
    """Before any case runs: every output location can be written (OutputError naming the parameter
    otherwise), the report and the stream are locked for this run (OutputError naming the run that
    holds one), and neither holds an earlier run's output unless `overwrite` or `resume` says so
    (SpecError)."""
    check_outputs({"junit": request.junit}, request.repro_dir)
    return claimed(run_files(request.report, request.stream_path, request.stream is not None),
                   overwrite=request.overwrite or request.resume is not None, resumable=True)


def _plan_info(planned: EnvelopePlan) -> dict[str, Any]:
    """What the report keeps of an envelope plan: what each backend left out, and which run nothing."""
    return {"omitted": {name: [{"family": f, "reason": r} for f, r in left] for name, left in planned.omitted.items()},
            "idle": planned.idle, "cases": len(planned.cases)}


def _fitting(cases: list[PlannedCase], device: str) -> list[PlannedCase]:
    """`cases`, once each distinct spec is known to fit this device's memory: SpecError with the numbers
    before anything is allocated (an envelope plan fits its cases itself)."""
    if not cases:
        return cases
    spare = Target.probe(Device(device)).memory_bytes
    host = hardware.host_memory() if device == "cpu" else None
    bound = f"; {host.bound} bounds it" if host is not None else ""
    for spec in dict.fromkeys(c.spec for c in cases):
        needed = estimate_bytes(spec).total(Device(device))
        require(needed <= spare, "spec", spec.name, f"a case that fits the {spare / 2**30:.1f} GiB this {device} "
                f"can spare; it needs {needed / 2**30:.1f} GiB ({estimate_bytes(spec).describe(Device(device))})"
                f"{bound}")
    return cases


def _envelope(request: RunRequest, backends: list[Loaded]) -> EnvelopePlan | None:
    """The envelope plan, when the suite is one: on this device, at its scale, inside its memory."""
    if request.suite.spec is not None or request.suite.cases != CaseKind.ENVELOPE:
        return None
    shaped = {k: v for k, v in dict(next_n=request.suite.next_n, block_sizes=request.suite.block_sizes,
                                    **request.suite.overrides).items() if v}
    require(not shaped, next(iter(shaped), "cases"), next(iter(shaped.values()), None),
            "cases random, edges or all with it: the envelope suite draws its shapes from each backend's envelope")
    target = Target.probe(Device(request.config.device))
    return envelope_plan(backends, target, request.suite.seed, request.suite.count or 1)


def _drawn(cases: list[PlannedCase], device: str, deadline: float | None, left: list[str]) -> Iterator[Case | NotDrawn]:
    """The planned cases as tensors, drawn on the run's device (a 128K-context batch would take seconds
    on the CPU), until `deadline` (time.monotonic()): the names of those never started go to `left`. A case
    that runs out of memory being drawn is a NotDrawn (its backends' results are SKIPs that say so)."""
    for index, planned in enumerate(cases):
        if deadline is not None and time.monotonic() > deadline:
            left.extend(c.name for c in cases[index:])
            return
        yield drawn_or_not(planned, device)


def drawn_or_not(planned: PlannedCase, device: str, validate: bool = True) -> Case | NotDrawn:
    """`planned` drawn on `device` (validated unless the runner will validate what it runs), or the NotDrawn of
    a case that ran out of memory being drawn (a GPU shared with other runs): its backends' results are SKIPs
    that say so, and name the families the case was planned for."""
    try:
        return planned.build(device, validate=validate)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        return not_drawn(planned, device, exc)


def not_drawn(planned: PlannedCase, device: str, exc: BaseException) -> NotDrawn:
    """A planned case that ran out of memory being drawn: its error, what drawing it needs and what is free."""
    spec = planned.spec
    footprint = estimate_bytes(spec)
    free = hardware.available_memory(device)
    host = hardware.host_memory() if device == "cpu" else None
    shown = "not known" if free is None else memory.size_text(free)
    bound = f" ({host.bound})" if host is not None else ""
    reason = (f"not drawn: drawing the case ran out of memory ({type(exc).__name__}: {first_line(exc)}); it needs "
              f"about {memory.size_text(footprint.total(Device(device)))} ({footprint.describe(Device(device))}), "
              f"{shown} free on {device}{bound}")
    description = (f"B={spec.total_batch} next_n={spec.next_n} H={spec.heads} D={spec.head_dim} "
                   f"block={spec.block_size} max_model_len={spec.max_model_len} fp8={spec.fp8.value}")
    reach = Reach(planned.families, spec_shape(spec).longest, footprint.pool_bytes, spec.total_batch)
    return NotDrawn(planned.name, description, spec.total_batch * spec.next_n, reason, spec.to_json(), reach,
                    planned.reach)


def _taker(cases: list[PlannedCase]) -> Callable[[str, Case], bool] | None:
    """Which backends run which case: those the plan chose for it (every one for a plain suite)."""
    chosen = {c.name: c.backends for c in cases if c.backends is not None}
    if not chosen:
        return None
    return lambda backend, case: backend in chosen.get(case.name, (backend,))


def _here(request: RunRequest, backends: list[Loaded], cases: list[PlannedCase],
          on_result: Listener | None, extra: dict[str, Any], on_planned: Callable[[int], None] | None) -> RunOutcome:
    config, started = request.config, time.time()
    done = _resumed(request, cases, backends) if request.resume else {}
    if on_planned:
        on_planned(_pairs(cases, backends) - len(done))
    outputs = _outputs(request, backends, run_info(request, started, len(cases), len(done)), done)
    left: list[str] = []
    deadline = time.monotonic() + request.budget if request.budget else None
    current = _Current()
    drawn = current.track(_drawn(cases, config.device, deadline, left))
    finished: list[CaseResult] = [*done.values()]  # the whole run so far, in the order the stream holds it

    def heard(result: CaseResult) -> None:
        # A graph replay's case is not the drawn one: no bundle of it (its repro line replays the captured case)
        outputs.take(result, current.case if current.case is None or current.case.name == result.case else None)
        finished.append(result)
        if on_result:
            on_result(result)

    def made() -> dict[str, Any]:
        return {**run_info(request, started, len(cases), len(done)), "not_started": left, **extra}

    # Ctrl-C, or an output that can no longer be written (a full disk): the stream keeps every line written
    # so far; the report gets what finished, marked incomplete (difftest.records.outputs).
    with outputs.keeping(finished, made):
        results = run(backends, drawn, config, on_result=heard, done=done, takes=_taker(cases))
    info = made()
    written = outputs.finish(results, info)
    bundles, stream = outputs.of(BundleOutput), outputs.of(StreamOutput)
    return RunOutcome(results, info, bundles=len(bundles.written) if bundles else 0,
                      stream=stream.path if stream else None, written=written)


class _Current:
    """The case the runner is working on: it hands its listener only the result, and the results of a case
    arrive before it draws the next one."""

    def __init__(self) -> None:
        self.case: Case | None = None

    def track(self, cases: Iterable[Case | NotDrawn]) -> Iterator[Case | NotDrawn]:
        """The same cases, each remembered while the runner works on it (a case that could not be drawn
        leaves nothing to bundle: its results are SKIPs)."""
        for case in cases:
            self.case = case if isinstance(case, Case) else None
            yield case


def _outputs(request: RunRequest, backends: list[Loaded], info: dict[str, Any],
             done: dict[tuple[str, str], CaseResult], bundles: bool = True) -> Outputs:
    """The run's writers (difftest.records.outputs): its stream (after its run line and the results it
    resumes), a bundle per failing result (`bundles`: this process has the cases), the report, JUnit."""
    known = request.ledger.known if request.ledger else None
    return Outputs([
        _stream(request, info, done),
        BundleOutput(request.repro_dir, request.config, backends) if bundles and request.repro_dir else None,
        ReportOutput(request.report) if request.report else None,
        JUnitOutput(request.junit, "difftest run", known) if request.junit else None])


def _pairs(cases: list[PlannedCase], backends: list[Loaded]) -> int:
    """The (backend, case) pairs of the plan: each case's chosen backends, or every one."""
    return sum(c.backends is None or b.name in c.backends for c in cases for b in backends)


def _spread(request: RunRequest, backends: list[Loaded], cases: list[PlannedCase],
            envs: list[dict[str, str]], extra: dict[str, Any]) -> RunOutcome:
    """The plan's shards in child processes (difftest.workflows.spread), their results merged in plan order."""
    request.require_spreadable()  # what `gpus` checks at construction, for a run spread by `shard_envs`
    started = time.time()
    expected = [len(Shard(i, len(envs)).of(cases)) * len(backends) for i in range(len(envs))]
    try:
        shards = spread.run_shards(request.argv, envs, expected)
    except spread.ShardsInterrupted as stop:  # Ctrl-C: what the children finished, marked incomplete
        outcome = _merged(request, cases, stop.shards, {**extra, "incomplete": True}, started)
        kept = tuple(str(path) for path in (request.report, outcome.stream) if path)
        raise Interrupted(len(outcome.results), kept) from None
    return _merged(request, cases, shards, extra, started)


def _merged(request: RunRequest, cases: list[PlannedCase], shards: list[spread.ShardRun], extra: dict[str, Any],
            started: float) -> RunOutcome:
    """The shards' results in plan order, handed to the run's outputs (the shards wrote the bundles)."""
    results = spread.merge([c.name for c in cases], shards)
    info = {**run_info(request, started, len(cases)), "shards": [shard.info() for shard in shards], **extra}
    outputs = _outputs(request, [], info, {}, bundles=False)
    try:
        for result in results:
            outputs.take(result)
        written = outputs.finish(results, info)
    finally:
        outputs.close()
    stream = outputs.of(StreamOutput)
    bundles = _bundles_written(request.repro_dir, results)
    return RunOutcome(results, info, bundles=bundles, stream=stream.path if stream else None, shards=tuple(shards),
                      written=written)


def _bundles_written(repro_dir: Path | None, results: list[CaseResult]) -> int:
    """The reproducer bundles of `results` that the children wrote under `repro_dir`."""
    if repro_dir is None:
        return 0
    return sum((repro_dir / bundle_name(r)).is_dir() for r in results if r.verdict.failed)


# Run-info keys a resumed run must share with the run it resumes -> the parameter that sets each.
RESUMED_ALIKE = {"encoding_override": "encoding", "layout_override": "layout", "repeat": "repeat",
                 "oracle": "oracle", "cases_kind": "cases", "graph": "graph"}


def _resumed(request: RunRequest, cases: list[PlannedCase],
             backends: list[Loaded]) -> dict[tuple[str, str], CaseResult]:
    assert request.resume is not None
    refuse_link(request.resume, "resume", "report or stream")
    results = load_results(request.resume, "resume")
    _same_options(request, load_run_info(request.resume, "resume"))
    return kept_results(results, cases, [b.name for b in backends], request.config.device, str(request.resume))


def _same_options(request: RunRequest, earlier: list[dict[str, Any]]) -> None:
    """SpecError naming the first parameter (RESUMED_ALIKE) that `request` sets otherwise than the run
    it resumes did: results made under two what-ifs, repeat counts or oracles must not be mixed.
    A record that does not say (one the pytest plugin wrote) is taken at its word."""
    now = run_info(request, time.time(), 0)
    for header in earlier:
        for key, field in RESUMED_ALIKE.items():
            if key in header:
                require(header[key] == now[key], field, now[key], f"{header[key]!r}, what the run resumed from "
                        f"{request.resume} used (its results were made under it; start a new report to change it)")


def _stream(request: RunRequest, info: dict[str, Any], done: dict[tuple[str, str], CaseResult]) -> StreamOutput | None:
    """The JSONL stream; a resumed run appends to its own stream, and a new stream starts with the
    results it resumes, so every stream holds its whole run."""
    target = request.stream_path
    if target is None:
        return None
    same = request.resume is not None and request.resume.resolve() == target.resolve()
    require(not same or is_stream(target), "stream", str(target),
            "a JSONL stream to append to, not the JSON report given to resume")
    return StreamOutput(target, info, () if same else done.values(), append=same)


def run_info(request: RunRequest, started: float, cases: int, resumed: int = 0) -> dict[str, object]:
    """How the run was made: the command, versions, device and options, for the report and the stream."""
    config = request.config
    # A spread parent computes nothing: its results name their GPUs (CaseResult.gpu).
    gpu = torch.cuda.get_device_name() if config.device == "cuda" and request.gpus is None else None
    return {"command": "difftest " + shlex.join(request.argv), "seed": request.suite.seed, "cases": cases,
            "device": config.device, "gpu": gpu, **environment_info(started),
            "seconds": round(time.time() - started, 3), **config_info(config),
            "cases_kind": request.suite.cases.value, "budget": request.budget,
            "case_filter": list(request.suite.case_filter),
            "shard": str(request.suite.shard) if request.suite.shard else None,
            "resumed_from": str(request.resume) if request.resume else None, "resumed": resumed,
            "fail_slow": request.fail_slow}
