"""The runner: every case through the oracle once, then through every backend, one verdict each.

This module is the per-case loop; one backend's call on one case is difftest.engine.call, a batch of
small cases difftest.engine.batch_policy, and the memory model difftest.core.memory.

A backend that raises gets ERROR and the run goes on; a backend that cannot take a case gets SKIP
with the reason; results reach `on_result` as each one is made, so a report can stream them.
Every call is guarded (difftest.engine.guards): fresh tensors poisoned, inputs checksummed (a write into
them is FAIL(mutated-input)), `repeat` launches compared (difftest.engine.stability). With isolation
(difftest.engine.isolate) each backend runs in a worker process of its own, so a segfault, an abort or a
sticky CUDA error is CRASH and a hang past the timeout is TIMEOUT, and the run goes on; a case is
submitted to every backend's worker before any answer is awaited, so the workers compute side by
side and results still come in backend order, unless the calls would not fit the device's memory
together (difftest.core.memory.SideBySide): then one at a time. A call that runs out of memory beside
others is tried again alone once they are done, and counts only then (a SKIP with the bytes it needs
and those free, should it run out alone too); the cases as large as that one run their calls one at a
time from then on. Each fresh result goes through the caller's `amend` step before it is reported
(difftest.workflows.running attaches the compute-sanitizer replay there). With config.graph, each case's
results are followed by every backend's results on the case's graph replays (difftest.engine.graph).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping

from difftest.backends import Backend, Loaded, as_loaded
from difftest.core import hardware, memory
from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.errors import first_line, require
from difftest.core.kinds import Device
from difftest.core.verdict import Verdict
from difftest.engine import graph
from difftest.engine.batch import Batch
from difftest.engine.batch_policy import REBATCH_ROUNDS, RERUNS_IN_FLIGHT, started_batch
from difftest.engine.call import (
    Amend,
    OutOfMemory,
    amended,
    identity,
    run_one,
    settled_alone,
    start_backend,
    start_beside,
    unsupported_reason,
)
from difftest.engine.config import RunConfig
from difftest.engine.isolate import CACHE_KEPT_BYTES, Executor, InProcess, WorkerPool, release_cache
from difftest.engine.result import CallMemory, CaseResult, Reach
from difftest.generators.graph_family import FAMILY, replay_name
from difftest.oracles.reference import Reference, make_reference

__all__ = ["REBATCH_ROUNDS", "RERUNS_IN_FLIGHT", "Amend", "Done", "NotDrawn", "Takes", "executors_for", "run",
           "run_one", "start_backend", "unsupported_reason"]

Done = Mapping[tuple[str, str], CaseResult]  # (backend name, case name) -> a result kept from an earlier run


@dataclasses.dataclass(frozen=True)
class NotDrawn:
    """A planned case that could not be drawn (it ran out of memory being made): every backend that would
    have run it gets a SKIP with `reason`, and the run goes on."""

    name: str
    description: str
    rows: int
    reason: str
    spec: dict[str, object] | None = None
    # How far into the envelope it would have gone (its planned families; longest, pool and batch as the spec
    # bounds them): a family whose case was not drawn shows in its SKIPs, so no reader takes the family as run.
    reach: Reach | None = None
    own: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (backend, its families), as PlannedCase.reach

    def reach_of(self, backend: str) -> Reach | None:
        """The reach for `backend`: its own plan's families where the plan says, else the case's."""
        own = dict(self.own)
        if self.reach is None or backend not in own:
            return self.reach
        return dataclasses.replace(self.reach, families=own[backend])


Item = Case | Batch | NotDrawn
Takes = Callable[[str, Case | NotDrawn], bool]  # whether the backend of this name runs this case


def run(backends: list[Backend], cases: Iterable[Item], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None, done: Done | None = None,
        takes: Takes | None = None, on_done: Callable[[Item], None] | None = None,
        amend: Amend | None = None) -> list[CaseResult]:
    """Every backend on every case (every pair `takes` allows: the others give no result); results
    in (case, backend) order.

    `done` maps (backend name, case name) to results kept from an earlier run: those pairs are not
    run again and do not reach `on_result`; their results take their place in the list. A backend
    runs in a worker (under isolation) rebuilt from the origin it was loaded from
    (difftest.backends.Loaded); one loaded otherwise has its origin found once, here. A
    difftest.engine.batch.Batch among the cases runs as one launch per backend, its results per member;
    once its launches are submitted, the next item is taken from `cases` before their answers are
    awaited, so an iterator that draws its cases on demand draws the next one while the workers
    compute. A NotDrawn among them gives its SKIPs. `on_done` hears each item once all its results are
    in. Every fresh result goes through `amend` (when given) before it reaches `on_result`. What the
    side-by-side rule learns holds for the rest of the run.
    """
    loaded = _checked(backends, config)
    results: list[CaseResult] = []
    items = iter(cases)
    rule = memory.SideBySide()
    with executors_for(loaded, config) as where, graph.replayers(config) as replays:
        item = _next_item(items)
        while item is not None:
            whole = item.case if isinstance(item, Batch) else item
            chosen = [i for i, b in enumerate(loaded) if takes is None or takes(b.name, whole)]
            picked = [loaded[i] for i in chosen], [where[i] for i in chosen]
            following = None  # a single case may be large: the next one is drawn after it, not beside it
            if isinstance(item, Batch):
                one_case = _case_runner(*picked, config, on_result, amend, rule, replays)
                finish = started_batch(*picked, item, config, on_result, amend, one_case)
                following = _next_item(items, finish)  # drawn while the workers compute
                results += finish()
            elif isinstance(item, NotDrawn):
                results += _not_drawn(picked[0], item, config, on_result)
            else:
                results += _run_case(*picked, item, config, on_result, done or {}, amend, rule, replays)
            if on_done:
                on_done(item)
            item = following if isinstance(item, Batch) else _next_item(items)
    return results


def _next_item(items: Iterator[Item], in_flight: Callable[[], list[CaseResult]] | None = None) -> Item | None:
    """The next case or batch, None at the end. Should drawing it fail while a batch is in flight, that
    batch is finished first (its results reach on_result) and the error goes on."""
    try:
        item = next(items, None)
    except Exception:  # an interrupt goes on at once, as it does while a batch's answers are awaited
        if in_flight is not None:
            in_flight()
        raise
    require(item is None or isinstance(item, (Case, Batch, NotDrawn)), "cases", type(item).__name__,
            "difftest.Case objects (or difftest.engine.batch.Batch)")
    return item


def _not_drawn(backends: list[Loaded], item: NotDrawn, config: RunConfig,
               on_result: Callable[[CaseResult], None] | None) -> list[CaseResult]:
    """A SKIP for every backend of a case that could not be drawn, with why."""
    results = []
    for backend in backends:
        contract = backend.contract
        result = CaseResult(backend=backend.name, case=item.name, description=item.description, rows=item.rows,
                            verdict=Verdict.SKIP, device=config.device,
                            encoding=config.encoding or contract.length_encoding,
                            layout=config.layout or contract.cache_layout, overridden=config.overridden,
                            seconds=0.0, reason=item.reason, spec=item.spec, library=contract.library,
                            reach=item.reach_of(backend.name))
        if on_result:
            on_result(result)
        results.append(result)
    return results


def _case_runner(backends: list[Loaded], executors: list[Executor], config: RunConfig,
                 on_result: Callable[[CaseResult], None] | None, amend: Amend | None,
                 rule: memory.SideBySide, replays: graph.Replayers | None) -> Callable[[Case], list[CaseResult]]:
    """What runs one case on these backends as the loop does (a batch's members, when they go alone)."""
    return lambda case: _run_case(backends, executors, case, config, on_result, {}, amend, rule, replays)


def _run_case(backends: list[Loaded], executors: list[Executor], case: Case, config: RunConfig,
              on_result: Callable[[CaseResult], None] | None, done: Done, amend: Amend | None,
              rule: memory.SideBySide, replays: graph.Replayers | None) -> list[CaseResult]:
    todo = [i for i, b in enumerate(backends) if (b.name, case.name) not in done]
    fresh: dict[int, CaseResult] = {}
    if todo:
        for index, result in _oracle_and_results(backends, executors, case, config, todo, rule):
            fresh[index] = amended(result, backends[index], case, executors[index], amend)
            if on_result:
                on_result(fresh[index])
    results = [fresh[i] if i in fresh else done[(b.name, case.name)] for i, b in enumerate(backends)]
    return results + (_graph_replays(backends, case, config, on_result, done, replays) if replays is not None else [])


def _graph_replays(backends: list[Loaded], case: Case, config: RunConfig,
                   on_result: Callable[[CaseResult], None] | None, done: Done,
                   replays: graph.Replayers) -> list[CaseResult]:
    """With config.graph: each backend's results on the replays of `case` (difftest.engine.graph), those
    `done` keeps from an earlier run not made again."""
    results = []
    case = case.validate().to(config.device)
    for backend in backends:
        names = [replay_name(case.name, index) for index in range(len(FAMILY))]
        if all((backend.name, name) in done for name in names):
            results += [done[(backend.name, name)] for name in names]
            continue
        for result in replays.results(backend, case):
            if on_result:
                on_result(result)
            results.append(result)
    return results


def _oracle_and_results(backends: list[Loaded], executors: list[Executor], case: Case, config: RunConfig,
                        todo: list[int], rule: memory.SideBySide) -> Iterator[tuple[int, CaseResult]]:
    """The oracle's answer on `case` (checked and moved to the run's device first), then (index, result) of
    each backend in `todo`; when checking the case or the oracle runs out of memory (a large case on a GPU
    other campaigns share), no backend runs and each result is a SKIP that says why, with the bytes the
    oracle needs and those free: there is nothing to judge an output against, and the run goes on."""
    try:
        case = case.validate().to(config.device)
        ref = make_reference(case, config.oracle_kind)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        reason = _oracle_out_of_memory(case, config, exc)
        for index in todo:
            yield index, CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason,
                                    **identity(backends[index], case, config))
        return
    yield from _results(backends, executors, case, ref, config, todo, rule)


def _oracle_out_of_memory(case: Case, config: RunConfig, exc: BaseException) -> str:
    """Why no backend ran: the oracle's error, what it needs and what is free."""
    need = memory.oracle_bytes(memory.Shape.of_case(case), Device(config.device))
    free = hardware.available_memory(config.device)
    shown = "not known" if free is None else memory.size_text(free)
    return (f"checking the case or its oracle ran out of memory, so no backend ran: {first_line(exc)}; the "
            f"oracle needs about "
            f"{memory.size_text(need)}, {shown} free on {config.device} now")


def _results(backends: list[Loaded], executors: list[Executor], case: Case, ref: Reference, config: RunConfig,
             todo: list[int], rule: memory.SideBySide) -> Iterator[tuple[int, CaseResult]]:
    """(index, result) of each backend in `todo`, in order. Every call is submitted before any is
    waited for, so workers compute side by side, unless the side-by-side rule says the calls do not fit
    the device's free memory together (on the H200, seven backends' 8 GiB outputs of a 2^31-logit case
    ran out of memory): then one call at a time. A call that runs out of memory beside the others is
    tried again alone once they are all done (its result, and the later ones, wait for it), and the rule
    learns that calls this large do not run side by side."""
    shape = memory.Shape.of_case(case)
    counted = {index: rule.counted(backends[index].name, shape, backends[index].contract) for index in todo}
    together = len(todo) > 1 and rule.together(counted.values(), hardware.available_memory(config.device))
    if not together:
        for index in todo:
            yield index, _alone(backends[index], executors[index], case, ref, config, counted[index], rule, shape,
                                learned=len(todo) > 1)
        return
    started = {index: start_beside(backends[index], case, ref, config, executors[index]) for index in todo}
    waiting: dict[int, CaseResult | OutOfMemory] = {}  # from the first call that ran out of memory on
    for index in todo:
        result = started.pop(index)()  # popped: that call's inputs are freed with its closure
        if waiting or isinstance(result, OutOfMemory):
            waiting[index] = result
        else:
            yield index, _learned(result, rule, shape, counted[index], backends[index])
    if waiting:  # one ran out: every call is done now, so each one that ran out is tried again alone
        rule.ran_out(sum(counted.values()))
    for index, result in waiting.items():
        if isinstance(result, OutOfMemory):
            again = _alone(backends[index], executors[index], case, ref, config, counted[index], rule, shape)
            yield index, _noted(again, retried=result.describe())
        else:
            yield index, _learned(result, rule, shape, counted[index], backends[index])


def _alone(backend: Loaded, executor: Executor, case: Case, ref: Reference, config: RunConfig, counted: int,
           rule: memory.SideBySide, shape: memory.Shape, learned: bool = True) -> CaseResult:
    """`backend` on `case` with no other call in flight, the memory this process keeps cached given back
    first where the call is large (what this process frees into its cache, a worker cannot use); out of
    memory, a SKIP with the numbers. `learned`: it ran alone for want of memory (noted)."""
    if config.device == "cuda" and counted > CACHE_KEPT_BYTES:
        release_cache()
    result = settled_alone(start_beside(backend, case, ref, config, executor)(), backend, case, config, counted)
    result = _learned(result, rule, shape, counted, backend)
    return _noted(result, alone=True, counted=counted) if learned or result.memory is not None else result


def _learned(result: CaseResult, rule: memory.SideBySide, shape: memory.Shape, counted: int,
             backend: Loaded) -> CaseResult:
    """`result`, its memory note completed with what the rule counted; the rule learns what a call
    was measured to allocate."""
    if result.memory is None:
        return result
    if result.memory.measured is not None:
        rule.measured(backend.name, result.memory.measured, shape.logits)
    return _noted(result, counted=counted)


def _noted(result: CaseResult, **note: object) -> CaseResult:
    """`result` with `note`'s fields set in its memory note (one made where it had none)."""
    return dataclasses.replace(result, memory=dataclasses.replace(result.memory or CallMemory(), **note))


def _checked(backends: list[Backend], config: RunConfig) -> list[Loaded]:
    """The backends with their origins; SpecError for one that is not a backend, or a device this machine lacks."""
    loaded = [as_loaded(backend, f"backends[{index}]") for index, backend in enumerate(backends)]
    for index, backend in enumerate(loaded):
        require(isinstance(backend.contract, Contract), f"backends[{index}].contract", backend.contract,
                "a difftest.Contract")
    hardware.require_device(config.device)
    return loaded


@contextlib.contextmanager
def executors_for(backends: list[Loaded], config: RunConfig) -> Iterator[list[Executor]]:
    """Where each backend runs, for as long as the context lasts: its own worker process under isolation
    (config.isolated; a worker that dies or hangs is replaced at the next call), this process otherwise."""
    if not config.isolated:
        yield [InProcess() for _ in backends]
        return
    with WorkerPool(backends, config.device, config.timeout, config.startup_timeout) as pool:
        yield pool.executors
