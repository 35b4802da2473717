"""`difftest fuzz`: a time-budgeted campaign over the envelope planner, its failures grouped by root cause.

Rounds of envelope plans (difftest.engine.plan.envelope_plan) with fresh seeds go through one runner, so the
worker processes start once per campaign, not once per round. Every failing result is reduced to a
signature (difftest.workflows.signatures: backend, verdict, and the explained pattern of its wrong masks or
its exception's type), its variants (draft rows, kinds of wrong rows, shapes) counted under it; the first
case of each signature is kept, written as a bundle, and shrunk (difftest.workflows.shrink), each probe where
the campaign runs the backend: in a fresh worker process per signature under isolation, so neither a crash
nor what the campaign left in this process (a faulted CUDA context, memory) decides a probe. A crash is
shrunk only so; a hang never (each probe would cost a timeout): its bundle is written as found.

The budget bounds the whole campaign: drawing and running cases, then bundling and shrinking. Once a
signature that can be shrunk is found, drawing stops `shrink_seconds` before the budget's end (a share of
the budget by default). That share is a reserve: it starts when drawing ends, so a case or batch still
under way then (and its retries) makes the campaign end that much late, never shrink nothing. The
signatures share it, each in turn the remaining time over the signatures still to shrink, or a few calls of
its backend where that is more; a probe that has started finishes, so the campaign may end that much late.
Drawing also ends at `until_failures` distinct signatures. Without a repro dir, the bundles go to a
temporary folder (CampaignOutcome.repro_dir says which).

A Regime (difftest.generators.regime) bounds the drawn cases (batch, context, shape). Small cases go in batches
(difftest.engine.batch) where every backend that runs them declares itself batchable: cases of one shape
and one set of backends are collected across rounds and launched together, so the per-call costs
(a round trip to each worker, an oracle launch) are paid once per batch; a case that fails in a
batch is tried again (with the batch's other failures, then alone) and that result counts
(difftest.engine.runner); where it passes then, the kernel is wrong on the merged case itself, and that case
is the failure (signature, bundle, shrink). Results go to the campaign's outputs (difftest.records.outputs):
the stream in buffered writes (at most CAMPAIGN_FLUSH_SECONDS of them lost if the campaign is killed), the
JSON report and JUnit XML at the end.

With `jobs` > 1 the cases are drawn by that many campaigns side by side, each in a child process with
its own workers and its share of the plan; the parent joins their results and streams, merges their
signatures, stops them all once their signatures together reach `until_failures` (or the time to
shrink them has come), and bundles and shrinks each signature once. A small-case campaign's main thread
is its limit, so jobs multiply its rate; a large case needs the GPU's time and memory, so job 0 draws every
large case and the other jobs only small ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import pickle
import shlex
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any, NoReturn

import torch

from difftest.backends import Loaded, Origin, get_backends
from difftest.core import hardware, memory
from difftest.core.case import Case
from difftest.core.errors import SpecError, first_line, require
from difftest.core.kinds import Device, OracleKind
from difftest.core.lifetime import die_with_parent
from difftest.core.memory import (
    BATCH_LOGITS,
    BATCH_MERGED_LOGITS,
    BATCH_POOL,
    SMALL_LOGITS,
    SMALL_POOL,
    is_small,
    jobs_reserve,
)
from difftest.core.prefetch import Prefetched
from difftest.core.verdict import Verdict
from difftest.engine.batch import Batch, BatchKey, Retry, batch_key, merge
from difftest.engine.config import RunConfig
from difftest.engine.isolate import DEFAULT_TIMEOUT, exit_description
from difftest.engine.plan import MAX_SEED, PlannedCase, build_together, envelope_plan
from difftest.engine.result import CaseResult
from difftest.engine.runner import NotDrawn
from difftest.generators.envelope import Target, estimate_bytes
from difftest.generators.regime import Regime
from difftest.records.commands import backend_target, case_command, replay_command, run_command
from difftest.records.outputs import (
    CAMPAIGN_FLUSH_SECONDS,
    BundleOutput,
    JUnitOutput,
    Outputs,
    ReportOutput,
    StreamOutput,
    check_outputs,
)
from difftest.records.report import config_info, environment_info
from difftest.records.run_info import Phases
from difftest.workflows.running import run
from difftest.workflows.session import drawn_or_not, not_drawn
from difftest.workflows.shrink import ShrinkResult, shrink
from difftest.workflows.signatures import Signature, Variants, signature

ROUND_SEEDS = 1_000_000  # seeds a round's plan spans: rounds never repeat a (spec, seed)
# A batch holds at most BATCH_CASES cases; its bytes and logits are capped by the memory model
# (difftest.core.memory: SMALL_LOGITS, SMALL_POOL, BATCH_LOGITS, BATCH_MERGED_LOGITS, BATCH_POOL).
BATCH_CASES = 64
# Batches drawn ahead of the runner, which itself takes the next item while a batch is in flight: at
# most PREFETCH_DEPTH + 2 batches are drawn and not finished (a few MiB each in the small regime). Two,
# so that the drawing thread can bank a batch during a long wait (a batch with many reruns).
PREFETCH_DEPTH = 2
DIVERGED_SHOWN = 5  # batch-only failures the campaign's end lists one by one
# A campaign's main thread is busy the whole time (launching, judging, re-running) while the GPU and the
# workers mostly wait (on the H200): several campaigns side by side, each in its own process
# with its own workers and its own share of the plan, draw cases that much faster. Each is one process
# and a worker per backend.
MAX_JOBS = 64
# The share of the budget kept for bundling and shrinking what a campaign finds, when not given: shrinking a
# case of the production envelope takes tens of probes, each a launch and an oracle of a smaller case.
SHRINK_SHARE = 0.25
# Calls of its backend a signature's shrink may take out of what is left before the others' even shares: a
# share too short for a probe shrinks nothing (nine signatures in 30 s of 2-s calls), a few probes shrink much.
SHRINK_CALLS = 8
PROGRESS_SECONDS = 0.2  # a progress listener hears the campaign at most this often while cases run
WAKE_SECONDS = 0.25  # how often the parent of jobs side by side looks at its clock between their messages


def require_campaign(budget: float, until_failures: int | None, seed: int) -> None:
    """SpecError naming the first of a campaign's budget, until_failures and seed that is out of its bounds (every
    operation's campaign checks them so)."""
    require(0 < budget <= 7 * 86400, "budget", budget, "seconds in (0, one week]")
    require(until_failures is None or until_failures >= 1, "until_failures", until_failures, "an integer >= 1")
    require(type(seed) is int and -MAX_SEED <= seed < MAX_SEED, "seed", seed, "an integer in [-2**62, 2**62)")


@dataclasses.dataclass(frozen=True)
class Campaign:
    """What a campaign is asked to do. Errors name these fields."""

    budget: float  # seconds for the whole campaign: drawing and running cases, bundling and shrinking
    backends: tuple[str, ...] | None = None
    config: RunConfig = dataclasses.field(default_factory=RunConfig)
    until_failures: int | None = None  # stop drawing at this many distinct failure signatures
    seed: int = 0
    # the first case of each signature goes here as a bundle, with its shrunk one (None: a temporary folder
    # when there is shrinking to do)
    repro_dir: Path | None = None
    stream: Path | None = None
    shrink_seconds: float | None = None  # the budget's share for bundling and shrinking; None: SHRINK_SHARE of it
    regime: Regime = dataclasses.field(default_factory=Regime)  # bounds on the drawn cases
    batching: bool = True  # small cases of one shape in one launch, where every backend allows it
    jobs: int = 1  # campaigns side by side in child processes, each drawing its share of the plan
    report: Path | None = None  # the JSON report: every result, and the campaign's signatures in its run info
    junit: Path | None = None  # JUnit XML of every result
    argv: tuple[str, ...] = ()  # the `fuzz` command line, recorded in the report

    def __post_init__(self) -> None:
        require_campaign(self.budget, self.until_failures, self.seed)
        require(self.shrink_seconds is None or (isinstance(self.shrink_seconds, (int, float))
                                                and 0 <= self.shrink_seconds <= self.budget),
                "shrink_seconds", self.shrink_seconds, f"seconds in [0, budget = {self.budget:g}]")
        require(isinstance(self.regime, Regime), "regime", self.regime, "a difftest.generators.regime.Regime")
        require(self.batching in (True, False), "batching", self.batching, "True or False")
        require(type(self.jobs) is int and 1 <= self.jobs <= MAX_JOBS, "jobs", self.jobs,
                f"an integer in [1, {MAX_JOBS}]")
        require(not (self.batching and self.config.metamorphic), "batching", self.batching,
                "False when metamorphic relations are checked (a batch's passing members are judged on its rows alone)")
        require(self.config.oracle_kind != OracleKind.NONE, "oracle", self.config.oracle_kind.value,
                "exact or fast: a campaign judges every case against an oracle")
        require(self.jobs == 1 or self.config.time is None, "jobs", self.jobs,
                "1 when launches are timed (jobs side by side share the GPU: each would time the others too)")

    @property
    def shrink_budget(self) -> float:
        """Seconds of the budget kept for bundling and shrinking what the campaign finds."""
        return SHRINK_SHARE * self.budget if self.shrink_seconds is None else float(self.shrink_seconds)


@dataclasses.dataclass
class Found:
    """The first failure of a signature: its case and result, the variants of every result with its
    signature, then its bundle and shrunk form."""

    signature: Signature
    case: Case
    result: CaseResult
    origin: Origin  # what loads its backend again (Loaded.origin)
    seen: int = 0  # failing results with this signature
    variants: Variants = dataclasses.field(default_factory=Variants)
    bundle: Path | None = None
    shrunk: ShrinkResult | None = None
    shrunk_bundle: Path | None = None
    unshrunk: str | None = None  # why it was not shrunk although it could be (the bundle of the case found stays)
    # other signatures whose cases shrank to this one's shrunk case (one bug, seen otherwise), with their counts
    also: dict[Signature, int] = dataclasses.field(default_factory=dict)

    @property
    def target(self) -> str:
        """What names its backend on a command line: a registered name or 'package.module:object'."""
        return backend_target(self.origin, self.signature.backend)


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a running campaign is, for a progress line."""

    seconds: float  # since the campaign started
    cases: int | None  # cases drawn so far (None for jobs side by side: they tell only what they find)
    signatures: int
    doing: str  # 'drawing cases', 'shrinking 2 of 3'


ProgressListener = Callable[[Progress], None]


@dataclasses.dataclass(frozen=True)
class CampaignOutcome:
    """What a campaign made: every result, its distinct failures, its rate and where its time went."""

    results: list[CaseResult]
    found: list[Found]
    cases: int
    seconds: float  # of drawing and running cases: the rate's
    batched: int = 0  # cases that ran inside a batch
    launches: int = 0  # batches those cases made
    # failed in a batch, passed when tried again: the kernel's answer depends on the batch
    diverged: tuple[CaseResult, ...] = ()
    # (seconds, cases drawn) when the first result came: worker start-up and first compilations are before it
    warm: tuple[float, int] = (0.0, 0)
    retries: tuple[Retry, ...] = ()  # the launches that tried batches' failed members again
    jobs: int = 1  # campaigns side by side that made it (Campaign.jobs)
    lost_jobs: tuple[str, ...] = ()  # jobs that died or raised before handing their results over, and how
    undrawn: tuple[str, ...] = ()  # "name: why" of each planned case that ran out of memory being drawn
    interrupted: bool = False  # Ctrl-C or SIGTERM ended the drawing: these are the results before it
    phases: Phases | None = None  # None until the campaign is over
    budget: float = 0.0  # Campaign.budget
    config: RunConfig = dataclasses.field(default_factory=RunConfig)  # how its backends were fed
    bundles: Path | None = None  # the folder its bundles went to
    temporary: bool = False  # whether that folder is a temporary one (no repro dir was given)
    written: dict[str, Path] = dataclasses.field(default_factory=dict)  # report, junit: what was written

    @property
    def warm_cases_per_second(self) -> float:
        """The rate after the first result: what a long campaign approaches."""
        seconds, cases = self.warm
        return (self.cases - cases) / (self.seconds - seconds) if self.seconds > seconds else 0.0

    @property
    def cases_per_second(self) -> float:
        return self.cases / self.seconds if self.seconds > 0 else 0.0


Now = Callable[[], float]  # seconds on a clock that only goes forward: time.monotonic, or a test's


class _Clock:
    """A campaign's time: its start on `now` (time.monotonic(), one clock for every process of the machine) and
    its budget, when drawing stops, and the progress listener, told at most every PROGRESS_SECONDS."""

    def __init__(self, start: float, campaign: Campaign, on_progress: ProgressListener | None = None,
                 now: Now = time.monotonic) -> None:
        self.start, self.campaign, self.on_progress, self.now = start, campaign, on_progress, now
        self.told = -float("inf")

    @property
    def end(self) -> float:
        return self.start + self.campaign.budget

    def drawing_ends(self, signatures: Iterable[Signature]) -> float:
        """When drawing stops: the budget's end, less its shrinking share once a signature that shrinking
        may probe is found (a campaign that finds nothing draws cases until its end)."""
        config = self.campaign.config
        shrinks = any(_shrinkable(s.verdict, config) for s in signatures)
        return self.end - (self.campaign.shrink_budget if shrinks else 0.0)

    def tell(self, cases: int | None, signatures: int, doing: str, now: bool = False) -> None:
        """The listener hears where the campaign is (`now`: whenever it last heard)."""
        moment = self.now()
        if self.on_progress is None or (not now and moment - self.told < PROGRESS_SECONDS):
            return
        self.told = moment
        self.on_progress(Progress(moment - self.start, cases, signatures, doing))


def fuzz(campaign: Campaign, on_progress: ProgressListener | None = None,
         on_result: Callable[[CaseResult], None] | None = None, now: Now = time.monotonic) -> CampaignOutcome:
    """Run `campaign` within its budget: cases (drawn by `jobs` campaigns side by side, each its share of the
    plan, when jobs > 1) until its failure count or the time to shrink what it found, then a bundle per
    signature, shrunk in turn in what is left; last its report and JUnit XML where asked for. `on_progress`
    hears where it is (a few times a second at most); `on_result` each result as it comes (one job's campaign:
    the outcome's results are the ones that count, a batch's failure tried again included). `now` is the
    campaign's clock (jobs side by side keep time.monotonic, the one clock of every process)."""
    require(campaign.jobs == 1 or now is time.monotonic, "jobs", campaign.jobs,
            "1 when the campaign keeps a clock of its own (jobs side by side share time.monotonic)")
    start, started = now(), time.time()
    hardware.require_device(campaign.config.device)  # this host's, not the campaign's: checked where it runs
    campaign = bounded(campaign)
    outputs = _outputs(campaign)
    clock = _Clock(start, campaign, on_progress, now)
    backends = get_backends(list(campaign.backends) if campaign.backends else None)
    drawn = (_in_jobs(campaign, backends, clock) if campaign.jobs > 1
             else _drawn(campaign, backends, clock, on_result=on_result))
    cases_done = now()
    if drawn.interrupted:
        _keep_interrupted(campaign, drawn, outputs, started, cases_done - start)
    folder = _bundle_folder(campaign, drawn.found)
    try:
        found = _kept(drawn, backends, campaign, clock, folder)
    except KeyboardInterrupt:  # while bundling or shrinking: the cases' results are whole, and kept
        _keep_interrupted(campaign, drawn, outputs, started, cases_done - start)
    end = now()
    outcome = dataclasses.replace(drawn, found=found, phases=Phases(cases_done - start, end - cases_done, end - start),
                                  budget=campaign.budget, config=campaign.config, bundles=folder,
                                  temporary=folder is not None and campaign.repro_dir is None)
    written = outputs.finish(outcome.results, campaign_info(campaign, outcome, started))
    return dataclasses.replace(outcome, written=written)


def bounded(campaign: Campaign) -> Campaign:
    """`campaign` with its isolated calls waiting at most its budget (DEFAULT_TIMEOUT at most) where it gave no
    timeout: a call that never answers (a hang, a compilation that does not end) is a TIMEOUT within the
    campaign's time, not a campaign that outlives its budget by DEFAULT_TIMEOUT (FlagGems' metadata at 65537
    requests on the H200: docs/findings/flaggems-metadata-whole-batch-program.md)."""
    config = campaign.config
    if config.timeout is not None or not config.isolated:
        return campaign
    return dataclasses.replace(campaign, config=dataclasses.replace(config,
                                                                    timeout=min(DEFAULT_TIMEOUT, campaign.budget)))


def _keep_interrupted(campaign: Campaign, drawn: CampaignOutcome, outputs: Outputs, started: float,
                      seconds: float) -> NoReturn:
    """A campaign stopped by Ctrl-C or SIGTERM (a job scheduler's `timeout`) while drawing, bundling or
    shrinking: its report and JUnit XML get the cases' results so far, marked incomplete, with no shrunk
    bundles (Outputs.stopped); then Interrupted says where they are (its jobs wrote its stream)."""
    outcome = dataclasses.replace(drawn, phases=Phases(seconds, 0.0, seconds), budget=campaign.budget,
                                  config=campaign.config)
    raise outputs.stopped(outcome.results, campaign_info(campaign, outcome, started), resumable=False,
                          streamed=campaign.stream)


def _outputs(campaign: Campaign) -> Outputs:
    """The campaign's report and JUnit XML, both written at its end; its stream is written as results come, by
    each job (_drawn), and its bundles once it is over (_kept). Every one is checked writable before the
    campaign starts: a path that cannot be written is one OutputError, not a campaign's work lost."""
    check_outputs({"report": campaign.report, "junit": campaign.junit, "stream": campaign.stream}, campaign.repro_dir)
    return Outputs([ReportOutput(campaign.report) if campaign.report else None,
                    JUnitOutput(campaign.junit, "difftest fuzz") if campaign.junit else None])


def _drawn(campaign: Campaign, backends: list[Loaded], clock: _Clock, link: _Link | None = None,
           on_result: Callable[[CaseResult], None] | None = None) -> CampaignOutcome:
    """The campaign's cases, run until its budget or failure count, nothing kept yet; as one job of several
    (`link`), its share of the plan, until the campaign's stop too."""
    state = _State(campaign, backends, link, clock)
    start = time.monotonic()
    stream = StreamOutput(campaign.stream, flush_seconds=CAMPAIGN_FLUSH_SECONDS) if campaign.stream else None
    outputs = Outputs([stream])
    interrupted = False
    try:
        results = run(backends, state.items(), campaign.config, on_result=state.heard(outputs, on_result),
                      takes=state.takes, on_done=state.finished)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what was heard is kept, and the campaign reports it
        if link is not None:  # a job of several: the parent stops every job and keeps their streamed parts
            raise
        results, interrupted = list(state.results), True
    finally:
        outputs.close()
    seconds = time.monotonic() - start
    warm = (state.warm[0] - start, state.warm[1]) if state.warm else (seconds, state.drawn)
    return CampaignOutcome(results, list(state.found.values()), state.drawn, seconds, state.batched,
                           state.launches, tuple(state.diverged), warm, tuple(state.retries),
                           undrawn=tuple(state.undrawn), interrupted=interrupted)


def _merged(found: list[Found]) -> list[Found]:
    """One entry per distinct shrunk case: signatures whose cases shrink to the same case (bit for bit) are
    one bug, seen in several ways (a window one short is 'no window' on rows of length 1); the first keeps
    the others' counts and lists their signatures (Found.also)."""
    kept: dict[object, Found] = {}
    for item in found:
        key = _fingerprint(item.shrunk.case) if item.shrunk else id(item)
        first = kept.setdefault(key, item)
        if first is not item:
            first.seen += item.seen
            first.variants.merge(item.variants)
            first.also[item.signature] = first.also.get(item.signature, 0) + item.seen
    return list(kept.values())


def _fingerprint(case: Case) -> str:
    """What tells two cases apart: the bytes of every tensor and the output's width (a shrunk case is small)."""
    digest = hashlib.sha256(str(case.max_model_len).encode())
    for tensor in (case.q, case.k_pool, case.scale_pool, case.weights, case.block_table, case.seq_lens):
        cpu = tensor.detach().to("cpu").contiguous()
        digest.update(f"{cpu.dtype}{tuple(cpu.shape)}".encode())
        digest.update(cpu.view(torch.uint8).numpy().tobytes() if cpu.numel() else b"")
    return digest.hexdigest()


# --------------------------------------------------------------------------- jobs side by side

def _in_jobs(campaign: Campaign, backends: list[Loaded], clock: _Clock) -> CampaignOutcome:
    """The campaign drawn by campaign.jobs child processes side by side, each with its own workers and its
    share of one plan (_Link.takes: small case k goes to job k mod jobs, every large case to job 0),
    streaming into a part of its own (`<stream>.job<i>`, joined into the stream at the end); their outcomes
    joined. A script that asks for jobs needs the `if __name__ == "__main__":` guard that multiprocessing's
    spawn asks of every program. A job that dies or raises costs only its own results (its streamed part
    stays), and the outcome says which and how (lost_jobs). A plan without a small case runs as one job."""
    target = _job_target(campaign, len(backends))
    # A regime no planned case fits: one SpecError here, not one per job.
    if not any(_small(case) for case in first_round(backends, target, campaign.regime, campaign.seed)):
        return _drawn(campaign, backends, clock)  # only large cases: every job but job 0 would have none to draw
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    stop = context.Event()
    # The campaign's clock: the jobs' start-up counts, as a worker's does.
    jobs = [_started(context, campaign, index, stop, target, clock.start) for index in range(campaign.jobs)]
    try:
        outcomes, lost = _gathered(jobs, stop, campaign.until_failures, clock)
    finally:
        for _receive, process in jobs:  # all done, unless one raised or this process is interrupted
            if process.is_alive():
                process.kill()
            process.join()
        _join_parts(campaign)
    return _joined(outcomes, campaign, lost, clock.start, time.monotonic() - clock.start)


def _job_target(campaign: Campaign, backends: int) -> Target:
    """What every job plans for: this device, with the memory job 0's large cases may use: what the probe
    finds less the other jobs' reserve (_reserve), but at least half of it, or on a small host (a CI
    runner's 9 GiB) the reserve would leave job 0 nothing to plan with."""
    probed = Target.probe(Device(campaign.config.device))
    kept = min(_reserve(campaign, backends), probed.memory_bytes // 2)
    return dataclasses.replace(probed, memory_bytes=probed.memory_bytes - kept)


def _reserve(campaign: Campaign, backends: int) -> int:
    """Bytes job 0's plan leaves to the rest (difftest.core.memory.jobs_reserve): a small job's bytes for each
    other job and, on a GPU, what each process of every job holds besides cases (the job and, isolated, a
    worker per backend)."""
    processes = 1 + (backends if campaign.config.isolated else 0) if campaign.config.device == "cuda" else 0
    return jobs_reserve(campaign.jobs, processes)


def _started(context: multiprocessing.context.SpawnContext, campaign: Campaign, index: int, stop: EventType,
             target: Target, start: float) -> tuple[Connection, BaseProcess]:
    """Job `index` of campaign.jobs, started on the campaign's clock (`start`): the end of its pipe this
    process reads, and its process."""
    receive, send = context.Pipe(duplex=False)
    part = None if campaign.stream is None else _part(campaign.stream, index)
    # One job each, streaming into its own part, nothing kept: the parent keeps what they find.
    job = dataclasses.replace(campaign, stream=part, jobs=1, repro_dir=None)
    link = _Link(index, campaign.jobs, stop, send, target, start)
    process = context.Process(target=_job, args=(job, link, os.getpid()),
                              name=f"difftest-fuzz-job-{index}")
    process.start()
    send.close()  # the child's end, closed here: EOF here when it dies
    return receive, process


def _part(stream: Path, index: int) -> Path:
    return stream.with_name(f"{stream.name}.job{index}")


@dataclasses.dataclass(frozen=True)
class _Link:
    """What ties a job to its campaign: which job of how many it is (its share of the plan: `takes`), the
    campaign's stop (set when the jobs' signatures together reach the failure count, or the time to shrink
    them comes), the pipe its news goes up, the target it plans for and the campaign's start."""

    index: int
    count: int
    stop: EventType
    send: Connection
    target: Target  # what every job plans for (_job_target)
    start: float  # the campaign's start, time.monotonic() (one clock for every process of the machine)

    def takes(self, planned: Iterable[PlannedCase]) -> Iterator[PlannedCase]:
        """This job's cases of the plan: the small ones dealt out in turn (small case k to job k mod count),
        and to job 0 every large one. Dealt by their count among the small cases, not by their place in
        the plan: by place, a job whose places only ever held large cases would wait for ever."""
        small = itertools.count()
        for case in planned:
            if _small(case):
                if next(small) % self.count == self.index:
                    yield case
            elif self.index == 0:
                yield case

    def tell(self, message: tuple[str, object]) -> None:
        """("found", signature) for each new signature; ("done", (outcome, began)) or ("raised", the line of the
        exception) last."""
        # Plain pickle: tensors by value. The connection's own pickler (torch's reductions) would hand over a
        # file descriptor per tensor, served by this process, which exits after its last message.
        self.send.send_bytes(pickle.dumps(message))


def _job(campaign: Campaign, link: _Link, parent: int) -> None:
    """A job's main: its share of the campaign, then its outcome (found cases on the CPU) to the parent."""
    die_with_parent(parent)
    began = time.monotonic()  # one clock for every process of the machine (CLOCK_MONOTONIC)
    try:
        backends = get_backends(list(campaign.backends) if campaign.backends else None)
        outcome = _drawn(campaign, backends, _Clock(link.start, campaign), link)
        found = [dataclasses.replace(f, case=f.case.to("cpu")) for f in outcome.found]
        answer: tuple[str, object] = ("done", (dataclasses.replace(outcome, found=found), began))
    except BaseException as exc:  # the parent lists the job as lost, with this line
        answer = ("raised", f"{type(exc).__name__} at {_where(exc)}: {exc}")
    link.tell(answer)


def _where(exc: BaseException) -> str:
    """The innermost frame an exception was raised in, as `path:line (function)`, the path from the
    package's parent on (a lost job's line says where without its traceback)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    frame = frames[-1]
    parts = Path(frame.filename).parts
    short = Path(*parts[-2:]) if len(parts) >= 2 else Path(frame.filename)
    return f"{short}:{frame.lineno} ({frame.name})"


def _gathered(jobs: list[tuple[Connection, BaseProcess]], stop: EventType, until_failures: int | None,
              clock: _Clock | None = None) -> tuple[list[tuple[CampaignOutcome, float]], tuple[str, ...]]:
    """Each job's outcome and when it began, in job order, and how each job that died or raised did (its
    exception's first line); `stop` set once the signatures the jobs found, together, reach `until_failures`,
    or (`clock`) once drawing must end for them to be shrunk (a job knows only the signatures it found)."""
    answers: dict[int, tuple[CampaignOutcome, float] | str] = {}
    signatures: set[Signature] = set()
    waiting = {receive: index for index, (receive, _process) in enumerate(jobs)}
    while waiting:
        for receive in connection_wait(list(waiting), timeout=None if clock is None else WAKE_SECONDS):
            index = waiting[receive]
            kind, payload = _message(receive, jobs[index][1])
            if kind == "found":
                signatures.add(payload)
                if until_failures is not None and len(signatures) >= until_failures:
                    stop.set()
                continue
            # A job that raised is lost like one that died: the other jobs' results are kept.
            answers[index] = f"raised {payload.splitlines()[0]}" if kind == "raised" else payload
            del waiting[receive]
        if clock is not None:
            if clock.now() > clock.drawing_ends(signatures):
                stop.set()
            clock.tell(None, len(signatures), "drawing cases")
    outcomes = [answer for _index, answer in sorted(answers.items()) if not isinstance(answer, str)]
    lost = tuple(f"job {index} {answer}" for index, answer in sorted(answers.items()) if isinstance(answer, str))
    return outcomes, lost


def _message(receive: Connection, process: BaseProcess) -> tuple[str, Any]:
    """A job's next message (_Link.tell), or ("died", how) when its pipe ends without its outcome."""
    try:
        return pickle.loads(receive.recv_bytes())  # frames from this module's own jobs
    except EOFError:
        process.join()
        return "died", f"died ({exit_description(process.exitcode)}) before handing its results over"


def _joined(outcomes: list[tuple[CampaignOutcome, float]], campaign: Campaign, lost: tuple[str, ...], start: float,
            seconds: float) -> CampaignOutcome:
    """One outcome of the jobs' (each with when it began): results in job order, each signature once (its
    first job's first case, moved back to the campaign's device, and every job's count), `seconds` from
    `start` (before the jobs were started) to the last answer."""
    found: dict[Signature, Found] = {}
    for item in (f for outcome, _began in outcomes for f in outcome.found):
        if item.signature in found:
            found[item.signature].seen += item.seen
            found[item.signature].variants.merge(item.variants)
        else:
            found[item.signature] = dataclasses.replace(item, case=item.case.to(campaign.config.device))
    # Warm from the last job's first result on the campaign's clock, with every job's cases before its own.
    warm = (max((began - start + o.warm[0] for o, began in outcomes), default=seconds),
            sum(o.warm[1] for o, _began in outcomes))
    runs = [outcome for outcome, _began in outcomes]
    return CampaignOutcome([r for o in runs for r in o.results], list(found.values()), sum(o.cases for o in runs),
                           seconds, sum(o.batched for o in runs), sum(o.launches for o in runs),
                           tuple(r for o in runs for r in o.diverged), warm, tuple(r for o in runs for r in o.retries),
                           campaign.jobs, lost, tuple(u for o in runs for u in o.undrawn))


def _join_parts(campaign: Campaign) -> None:
    """The jobs' streamed parts appended to the campaign's stream in job order, then removed."""
    if campaign.stream is None:
        return
    with campaign.stream.open("wb") as joined:
        for index in range(campaign.jobs):
            part = _part(campaign.stream, index)
            if part.exists():
                with part.open("rb") as piece:
                    shutil.copyfileobj(piece, joined)
                part.unlink()


@dataclasses.dataclass
class _Bucket:
    """Planned cases of one shape and set of backends waiting to make a batch, with their running sizes."""

    cases: list[PlannedCase] = dataclasses.field(default_factory=list)
    logits: int = 0
    pool_bytes: int = 0
    rows: int = 0
    width: int = 0  # the widest member's max_model_len

    def add(self, planned: PlannedCase) -> None:
        self.cases.append(planned)
        self.logits += _logits(planned)
        self.pool_bytes += _pool_bytes(planned)
        self.rows += _rows(planned)
        self.width = max(self.width, planned.spec.max_model_len)

    def takes(self, planned: PlannedCase) -> bool:
        """Whether the merged case stays inside BATCH_MERGED_LOGITS with `planned` in it (an empty bucket
        takes any small case)."""
        merged = (self.rows + _rows(planned)) * max(self.width, planned.spec.max_model_len)
        return not self.cases or merged <= BATCH_MERGED_LOGITS

    def full(self) -> bool:
        """Whether one more case could pass a batch's caps."""
        return len(self.cases) == BATCH_CASES or self.logits > BATCH_LOGITS - SMALL_LOGITS or \
            self.pool_bytes > BATCH_POOL - SMALL_POOL


class _State:
    """What the campaign knows while it runs: the cases of the items being run, the signatures found so far."""

    def __init__(self, campaign: Campaign, backends: list[Loaded], link: _Link | None = None,
                 clock: _Clock | None = None) -> None:
        self.campaign, self.backends, self.link = campaign, {b.name: b for b in backends}, link
        self.clock = clock or _Clock(time.monotonic(), campaign)
        # Jobs plan with the one target the parent probed: one plan, dealt out among them (_Link.takes).
        self.target = Target.probe(Device(campaign.config.device)) if link is None else link.target
        # The items drawn and not yet finished (the runner draws a batch's successor while it runs):
        # their cases (a batch's members) by name, and who takes each.
        self.current: dict[str, Case] = {}
        self.takers: dict[str, frozenset[str] | None] = {}
        self.found: dict[Signature, Found] = {}
        self.diverged: list[CaseResult] = []
        self.retries: list[Retry] = []
        self.drawn = self.batched = self.launches = 0
        self.undrawn: list[str] = []  # "name: why" of the planned cases that ran out of memory being drawn
        self.results: list[CaseResult] = []  # every result heard, kept for a campaign that is interrupted
        self.warm: tuple[float, int] | None = None  # (time.monotonic(), cases drawn) at the first result

    def items(self) -> Iterator[Case | Batch | NotDrawn]:
        """The planned cases, built: a small one waits in the bucket of its shape and backends until the
        bucket makes a full batch, any other goes alone. Ends when drawing must (_Clock.drawing_ends) or at
        the failure count (cases still waiting in buckets are dropped). A case that ran out of memory being
        drawn is a NotDrawn: its backends' SKIPs say so in the report.

        Batches are planned and drawn in a thread, PREFETCH_DEPTH ahead (difftest.core.prefetch), while this
        thread waits on the workers or judges; a case that goes alone is drawn here, when its turn
        comes, since it may be large. What the campaign counts, it counts as an item is handed out."""
        setup = _same_device(self.campaign.config.device)
        with Prefetched(self._jobs(), self._drawn_ahead, PREFETCH_DEPTH, setup) as ahead:
            for job, batch in ahead:
                if self._done():
                    return
                if isinstance(batch, list):  # a bucket that ran out of memory being drawn: its members' SKIPs
                    for planned, undrawn in zip(job, batch, strict=True):  # type: ignore[arg-type]
                        self.takers[undrawn.name] = planned.backends
                        yield self._not_drawn(undrawn)
                elif batch is not None:
                    yield self._handed(job, batch)
                else:
                    yield self._single(job)

    def _jobs(self) -> Iterator[PlannedCase | list[PlannedCase]]:
        """What each item will be: a planned case that goes alone, or a full bucket's planned cases."""
        buckets: dict[tuple[BatchKey, frozenset[str] | None], _Bucket] = {}
        planned_all = planned_cases(list(self.backends.values()), self.target, self.campaign.regime,
                                    self.campaign.seed)
        share = planned_all if self.link is None else self.link.takes(planned_all)
        for planned in share:
            key = self._bucket(planned)
            if key is None:
                yield planned
                continue
            bucket = buckets.setdefault(key, _Bucket())
            if not bucket.takes(planned):
                yield buckets.pop(key).cases
                bucket = buckets.setdefault(key, _Bucket())
            bucket.add(planned)
            if bucket.full():
                yield buckets.pop(key).cases

    def _drawn_ahead(self, job: PlannedCase | list[PlannedCase]) -> Batch | list[NotDrawn] | None:
        """A bucket's batch, drawn and merged (or, should that run out of memory, each member's NotDrawn); None
        for a case that goes alone."""
        if not isinstance(job, list):
            return None
        device = self.campaign.config.device
        try:
            return merge(build_together(job, device))
        except Exception as exc:
            if not memory.ran_out(exc):
                raise
            return [dataclasses.replace(undrawn, reason=f"{undrawn.reason} (drawn in a batch of {len(job)} cases)")
                    for undrawn in (not_drawn(planned, device, exc) for planned in job)]

    def _bucket(self, planned: PlannedCase) -> tuple[BatchKey, frozenset[str] | None] | None:
        """Which batches `planned` may join; None when it runs alone (large, or a backend not batchable)."""
        config = self.campaign.config
        if not self.campaign.batching or config.time is not None or not _small(planned):
            return None  # timed launches must time one case each
        takers = planned.backends if planned.backends is not None else self.backends
        if not all(self.backends[name].contract.batchable for name in takers):
            return None
        return batch_key(planned.spec), planned.backends

    def _single(self, planned: PlannedCase) -> Case | NotDrawn:
        """The planned case drawn, or its NotDrawn when drawing it ran out of memory."""
        # Not validated here: the runner validates what it runs (a batch's members through its merged case).
        case = drawn_or_not(planned, self.campaign.config.device, validate=False)
        self.takers[case.name] = planned.backends
        if isinstance(case, NotDrawn):
            return self._not_drawn(case)
        self.current[case.name] = case
        self.drawn += 1
        return case

    def _not_drawn(self, undrawn: NotDrawn) -> NotDrawn:
        """A case a device other campaigns share lacked the memory for: its SKIPs go in the report (they name the
        families it was planned for), and the campaign goes on."""
        self.undrawn.append(f"{undrawn.name}: {undrawn.reason}")
        return undrawn

    def _handed(self, bucket: list[PlannedCase], batch: Batch) -> Batch:
        self.current.update((case.name, case) for case in batch.members)
        self.takers[batch.case.name] = bucket[0].backends
        self.drawn += len(bucket)
        self.batched += len(bucket)
        self.launches += 1
        return batch

    def _done(self) -> bool:
        over = self.clock.now() > self.clock.drawing_ends(self.found)
        enough = self.campaign.until_failures is not None and len(self.found) >= self.campaign.until_failures
        stopped = self.link is not None and self.link.stop.is_set()  # the jobs' failures together are enough
        return over or enough or stopped

    def takes(self, backend: str, case: Case) -> bool:
        chosen = self.takers.get(case.name)
        return chosen is None or backend in chosen

    def finished(self, item: Case | Batch | NotDrawn) -> None:
        """`item`'s results are all in: a batch's merged case is a case too, where the runner found it
        failing (batch.whole)."""
        if isinstance(item, Batch):
            self.diverged += item.diverged
            self.retries += item.retries
            for result in item.whole.values():
                self._record(result, item.case)
        for case in item.members if isinstance(item, Batch) else (item,):
            self.current.pop(case.name, None)
        self.takers.pop(item.case.name if isinstance(item, Batch) else item.name, None)

    def heard(self, outputs: Outputs, also: Callable[[CaseResult], None] | None = None) -> Callable[[CaseResult], None]:
        def on_result(result: CaseResult) -> None:
            self.warm = self.warm or (time.monotonic(), self.drawn)
            self.results.append(result)
            case = self.current.get(result.case)
            outputs.take(result, case)
            if result.verdict.failed and case is not None:
                self._record(result, case)
            self.clock.tell(self.drawn, len(self.found), "drawing cases")
            if also is not None:
                also(result)
        return on_result

    def _record(self, result: CaseResult, case: Case) -> None:
        """A failing result: a new signature's first case, or one more of a known one; its variants counted."""
        key = signature(result)
        found = self.found.get(key)
        if found is None:
            found = self.found[key] = Found(key, case, result, self.backends[result.backend].origin)
            if self.link is not None:
                self.link.tell(("found", key))
        found.seen += 1
        found.variants.add(result, case)


def planned_cases(backends: list[Loaded], target: Target, regime: Regime, seed: int) -> Iterator[PlannedCase]:
    """Rounds of envelope plans with fresh seeds, without end, each case moved inside `regime` (or left
    out); SpecError naming a bound when no planned case fits the regime.

    Round i is envelope_plan(backends, target, seed + ROUND_SEEDS * i): the plan's specs do not depend on
    the seed, and its seeds are the seed plus an offset, so the plan is made once and each round shifts
    its seeds (planning took 2 ms per case at production scale, more than drawing the case on a GPU)."""
    cases = first_round(backends, target, regime, seed)
    for round_index in itertools.count():
        yield from (dataclasses.replace(p, seed=p.seed + ROUND_SEEDS * round_index) for p in cases)


def first_round(backends: list[Loaded], target: Target, regime: Regime, seed: int) -> list[PlannedCase]:
    """Round 0 of planned_cases (every later round is its cases with other seeds); SpecError naming a bound
    when no planned case fits the regime."""
    plan = envelope_plan(backends, target, seed)
    cases = [dataclasses.replace(p, spec=spec) for p in plan.cases if (spec := regime.apply(p.spec))]
    if not plan.cases:
        raise SpecError("backends", ",".join(b.name for b in backends), "a backend that can run a case here")
    if not cases:
        field = next(f.name for f in dataclasses.fields(regime) if getattr(regime, f.name) is not None)
        raise SpecError(field, getattr(regime, field), "bounds some planned case fits (the backends' "
                        f"envelopes plan shapes such as {sorted({_shape(p) for p in plan.cases})[:4]})")
    return cases


def _small(planned: PlannedCase) -> bool:
    """Whether the planned case is small: few logits, a small pool (it may batch; any job may draw it)."""
    return is_small(_logits(planned), _pool_bytes(planned))


def _logits(planned: PlannedCase) -> int:
    """The logits of each output of the planned case: rows x max_model_len."""
    return _rows(planned) * planned.spec.max_model_len


def _rows(planned: PlannedCase) -> int:
    spec = planned.spec
    return spec.total_batch * spec.next_n


def _pool_bytes(planned: PlannedCase) -> int:
    """The planned case's paged cache: keys and scales, at most."""
    return estimate_bytes(planned.spec).pool_bytes


def _shape(planned: PlannedCase) -> str:
    spec = planned.spec
    return f"H={spec.heads} D={spec.head_dim} block={spec.block_size} B<={spec.total_batch} " \
        f"max_model_len={spec.max_model_len}"


def _bundle_folder(campaign: Campaign, found: list[Found]) -> Path | None:
    """Where the signatures' bundles go: the repro dir, else a temporary folder when there is shrinking to
    do (it stays after the campaign: the outcome names it), else nowhere."""
    if campaign.repro_dir is not None:
        return campaign.repro_dir
    if found and campaign.shrink_budget > 0:
        return Path(tempfile.mkdtemp(prefix="difftest-fuzz-"))
    return None


def _kept(drawn: CampaignOutcome, backends: list[Loaded], campaign: Campaign, clock: _Clock,
          folder: Path | None) -> list[Found]:
    """Each signature's bundle in `folder`, then, in turn, its shrunk case and bundle where it can be probed
    safely, within the shrinking share; one entry per distinct shrunk case.

    The share is a reserve: it starts when drawing ends, so a drawing phase that overran its part (a case or a
    batch under way, its retries) moves the campaign's end later rather than leaving nothing to shrink with.
    Each signature gets the time left over the signatures still to shrink, or, where that is less, up to
    SHRINK_CALLS calls of its backend out of what is left: the first signatures are shrunk, not all left."""
    found = drawn.found
    if folder is None:
        return found
    deadline = clock.now() + campaign.shrink_budget
    bundles = BundleOutput(folder, campaign.config, backends)
    for item in found:
        item.bundle = bundles.write(item.case, item.result)
    shrinks = campaign.shrink_budget > 0  # 0: asked for no shrinking
    shrinkable = [item for item in found if shrinks and _shrinkable(item.result.verdict, campaign.config)]
    by_name = {backend.name: backend for backend in backends}
    # A backend's quickest call of the campaign: its first carries its start-up (imports, compilations).
    quickest: dict[str, float] = {}
    for result in drawn.results:
        if result.verdict != Verdict.SKIP:
            quickest[result.backend] = min(result.seconds, quickest.get(result.backend, result.seconds))
    for index, item in enumerate(shrinkable):
        clock.tell(None, len(found), f"shrinking {index + 1} of {len(shrinkable)}", now=True)
        call = quickest.get(item.signature.backend, item.result.seconds)
        left = deadline - clock.now()
        share = max(left / (len(shrinkable) - index), min(left, SHRINK_CALLS * call))  # what one spares goes on
        _shrunk(item, by_name[item.signature.backend], campaign, share, call, bundles)
    return _merged(found)


def _shrunk(found: Found, backend: Loaded, campaign: Campaign, seconds: float, call: float,
            bundles: BundleOutput) -> None:
    """The found case shrunk for about `seconds` (its backend's call takes about `call`) and bundled;
    found.unshrunk says why not when it could not be."""
    if seconds < 2 * call or seconds <= 0:  # the original's run and one probe: any less would overrun the budget
        found.unshrunk = (f"the budget was spent: {max(seconds, 0.0):.1f} s left for it, and one call of the backend "
                          f"took {call:.1f} s")
        return
    try:
        found.shrunk = shrink(found.case, backend, campaign.config, seconds)
    except SpecError:  # it no longer fails in-process (a flaky or isolation-only failure): the bundle stays
        return
    except Exception as exc:  # the oracle runs in this process, and without isolation the kernel too: a
        # probe that faults the device (an out-of-bounds write leaves CUDA's context unusable) must not cost
        # the campaign's end, nor the other signatures' bundles
        found.unshrunk = f"shrinking raised {type(exc).__name__}: {first_line(exc)}"
        return
    found.shrunk_bundle = bundles.write(found.shrunk.case, found.shrunk.result)


def _shrinkable(verdict: Verdict, config: RunConfig) -> bool:
    """Whether shrinking may probe a failure: a hang never (every probe that hangs costs a whole timeout);
    a crash only in a worker process (shrink probes where the config runs the backend)."""
    return verdict != Verdict.TIMEOUT and (verdict != Verdict.CRASH or config.isolated)


def repro_line(found: Found, config: RunConfig) -> str | None:
    """The `difftest run` line that draws the found case (its shrunk one, where it shrank on its spec) again
    through its backend, fed as `config` feeds it (difftest.records.commands); None for a case not drawn
    from a spec (a batch's merged case): its bundle replays it (bundle_line)."""
    shrunk = found.shrunk
    if shrunk is not None and shrunk.spec is not None and shrunk.seed is not None:
        return run_command(found.target, shrunk.spec, shrunk.seed, config)
    return case_command(found.target, found.case, config)


def bundle_line(found: Found) -> str | None:
    """The `difftest replay` line of the found case's bundle (its shrunk one, where there is one)."""
    folder = found.shrunk_bundle or found.bundle
    return None if folder is None else replay_command(folder, found.origin)


def render_campaign(outcome: CampaignOutcome) -> str:
    """The campaign's end: its rate and where its time went, then each signature with its count, its
    variants and the lines that run it again."""
    side_by_side = f" ({outcome.jobs} jobs side by side)" if outcome.jobs > 1 else ""
    lines = [f"{outcome.cases} cases in {outcome.seconds:.1f} s{side_by_side}: {outcome.cases_per_second:.1f} "
             f"cases/s ({outcome.warm_cases_per_second:.1f} after the first result); {len(outcome.found)} distinct "
             f"failures (signatures: backend, verdict, explained pattern)"]
    if outcome.phases is not None:
        p = outcome.phases
        lines.append(f"campaign: {p.total:.1f} s of a {outcome.budget:g}-s budget: cases {p.cases:.1f} s, bundling "
                     f"and shrinking {p.shrinking:.1f} s")
    lines += [f"lost: {how}" for how in outcome.lost_jobs]
    if outcome.undrawn:
        lines.append(f"not drawn: {len(outcome.undrawn)} planned cases ran out of memory being drawn (each a SKIP "
                     f"in the report; the campaign went on), the first: {outcome.undrawn[0]}")
    if outcome.launches:
        lines.append(f"batched: {outcome.batched} of the cases in {outcome.launches} launches; a case that failed "
                     f"in a batch was tried again (with the other failures, then alone), and that result counts")
    if outcome.retries:
        lines.append(describe_retries(outcome.retries))
    if outcome.diverged:
        lines.append(f"{len(outcome.diverged)} results failed in a batch and passed when tried again (the "
                     f"kernel's answer depends on what else is in the launch: the batch's merged case is the "
                     f"failure), the first:")
    for result in outcome.diverged[:DIVERGED_SHOWN]:
        lines.append(f"  {result.backend} on {result.case}: {result.verdict.value} in a batch, passes when tried again")
    for found in outcome.found:
        lines += _found_lines(found, outcome.config)
    if outcome.bundles is not None and outcome.found:
        lines.append(f"bundles: {outcome.bundles}" + (" (a temporary folder)" if outcome.temporary else ""))
    return "\n".join(lines)


def _found_lines(found: Found, config: RunConfig) -> list[str]:
    lines = [f"  {found.signature.describe()}: {found.seen} results, first {found.case.name} [{found.case.describe()}]"]
    variants = found.variants.describe()
    if variants:
        lines.append(f"    variants: {variants}")
    lines += [f"    also seen as {other.describe()}: {n} results (shrinks to the same case)"
              for other, n in found.also.items()]
    if found.shrunk is not None:
        lines.append(f"    shrunk: {found.shrunk.case.describe()}")
    if found.unshrunk is not None:
        lines.append(f"    not shrunk: {found.unshrunk}")
    drawn, replayed = repro_line(found, config), bundle_line(found)
    lines += [f"    repro: {drawn}"] if drawn else []
    lines += [f"    replay: {replayed}"] if replayed else []
    return lines


def describe_retries(retries: tuple[Retry, ...]) -> str:
    """One line on the launches that tried batches' failed members again, together and alone."""
    together = [r for r in retries if r.members > 1]
    alone = [r for r in retries if r.members == 1]
    members = sum(r.members for r in together)
    passed = members - sum(r.failed for r in together)
    return (f"tried again: {len(together)} launches of a batch's failed members together ({members} members, "
            f"{passed} passing there), {len(alone)} members alone ({sum(r.failed for r in alone)} failing)")


def campaign_info(campaign: Campaign, outcome: CampaignOutcome, started: float) -> dict[str, Any]:
    """How the campaign was made and what it found, as its report's run info records it: the command, the
    versions and when it `started` (time.time()), how backends were fed (difftest.records.report.config_info),
    the budget and where its time went, and each signature with its variants, bundles and repro lines."""
    phases = outcome.phases or Phases(0.0, 0.0, outcome.seconds)
    return {"command": "difftest " + shlex.join(campaign.argv) if campaign.argv else None, "seed": campaign.seed,
            "cases": outcome.cases, "device": campaign.config.device, **environment_info(started),
            "seconds": round(phases.total, 3), **config_info(campaign.config), "budget": campaign.budget,
            "campaign": {"shrink_seconds": campaign.shrink_budget, "jobs": outcome.jobs,
                         "phases": phases.to_json(),
                         "bundles": str(outcome.bundles) if outcome.bundles else None,
                         "signatures": [_found_info(found, campaign.config) for found in outcome.found]}}


def _signature_info(sign: Signature) -> dict[str, Any]:
    pattern = sign.relation.pattern if sign.relation is not None else sign.selection
    return {"backend": sign.backend, "verdict": sign.verdict.value,
            "pattern": pattern.value if pattern is not None else None, "error": sign.error}


def _found_info(found: Found, config: RunConfig) -> dict[str, Any]:
    return {**_signature_info(found.signature),
            "results": found.seen, "first": found.case.name, "description": found.case.describe(),
            "also": [{**_signature_info(other), "results": n} for other, n in found.also.items()],
            "variants": found.variants.to_json(), "bundle": str(found.bundle) if found.bundle else None,
            "shrunk": found.shrunk.case.describe() if found.shrunk else None,
            "shrunk_bundle": str(found.shrunk_bundle) if found.shrunk_bundle else None, "unshrunk": found.unshrunk,
            "repro": repro_line(found, config), "replay": bundle_line(found)}


def _same_device(device: str) -> Callable[[], None] | None:
    """What makes the drawing thread's current GPU this thread's (each thread has its own)."""
    if device != "cuda":
        return None
    index = torch.cuda.current_device()
    return lambda: torch.cuda.set_device(index)
