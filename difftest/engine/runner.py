"""The runner: every case through the oracle once, then through every backend, one verdict each.

A backend that raises gets ERROR and the run goes on; a backend that cannot take a case gets SKIP
with the reason; results reach `on_result` as each one is made, so a report can stream them.
Every call is guarded (difftest.engine.guards): fresh tensors poisoned, inputs checksummed (a write into
them is FAIL(mutated-input)), `repeat` launches compared (difftest.engine.stability). With isolation
(difftest.engine.isolate) each backend runs in a worker process of its own, so a segfault, an abort or a
sticky CUDA error is CRASH and a hang past the timeout is TIMEOUT, and the run goes on; a case is
submitted to every backend's worker before any answer is awaited, so the workers compute side by
side and results still come in backend order. Each fresh result goes through the caller's `amend`
step before it is reported (difftest.workflows.running attaches the compute-sanitizer replay there).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from difftest.backends import Backend, Loaded, as_loaded
from difftest.core import hardware
from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.errors import SpecError, first_line, require
from difftest.core.kernel_inputs import KernelInputs, encode
from difftest.core.verdict import Verdict, worst
from difftest.engine.batch import Batch, Retry, joined, merge, padded
from difftest.engine.comparison import Comparison, compare, compare_spans
from difftest.engine.config import RunConfig
from difftest.engine.guards import Execution, Fault, Launch, Outcome
from difftest.engine.isolate import Executor, InProcess, WorkerPool
from difftest.engine.result import CaseResult, Reach
from difftest.engine.stability import StabilityKind, classify_stability
from difftest.generators.envelope import CallSizes, call_bytes
from difftest.oracles.reference import Reference, make_reference

Done = Mapping[tuple[str, str], CaseResult]  # (backend name, case name) -> a result kept from an earlier run
Takes = Callable[[str, Case], bool]  # whether the backend of this name runs this case
# A step every fresh result goes through before it is reported, with the executor its backend ran in: the
# metamorphic relations (more launches of the backend, where it runs) and the compute-sanitizer replay of a
# failing result, which needs a bundle, a record the engine does not write (difftest.workflows.running).
Amend = Callable[[CaseResult, Loaded, Case, Executor], CaseResult]
# Workers' copies of one case's inputs, their outputs and the working memory their calls declare
# (call_bytes) may take this share of the GPU's free memory side by side: the rest is for the oracle,
# the comparison and what the kernels allocate undeclared.
SIDE_BY_SIDE_MEMORY = 0.2


def unsupported_reason(backend: Backend, case: Case, device: str) -> str | None:
    """Why `backend` cannot take `case` on `device`, or None."""
    return backend.unavailable_reason(device) or backend.contract.accepts(case, device)


def run_one(backend: Backend, case: Case, config: RunConfig, executor: Executor | None = None,
            amend: Amend | None = None) -> CaseResult:
    """One backend on one case, on config.device, against a fresh oracle answer; the backend runs in
    `executor` (one of `executors_for`'s), else in this process; the result goes through `amend`."""
    case = case.to(config.device)
    loaded = as_loaded(backend)
    where = executor or InProcess()
    result = start_backend(loaded, case, make_reference(case, config.oracle_kind), config, where)()
    return amend(result, loaded, case, where) if amend else result


def judged(backend: Loaded, case: Case, config: RunConfig, execution: Execution, ref: Reference,
           executor: Executor, contract: Contract | None = None) -> CaseResult:
    """The result of `launch`'s execution of `backend` on `case`, judged against `ref` (an oracle's answer, or
    another backend's: difftest.engine.consensus) under `contract` (default: the backend's)."""
    return _finished(execution, ref, contract or backend.contract, config, executor, _identity(backend, case, config))


def launch(backend: Loaded, case: Case, config: RunConfig, executor: Executor) -> Execution | CaseResult:
    """One call of `backend` on `case` in `executor`, encoded and guarded as every call is (config.repeat
    launches), and not judged: its outputs, or the result that says why there are none (SKIP, ERROR, CRASH,
    TIMEOUT). What a check that needs no oracle compares (difftest.engine.metamorphic, .consensus)."""
    base = _identity(backend, case, config)
    outcome = _submit(backend, case, config, executor, base)()
    if isinstance(outcome, Fault):
        return CaseResult(verdict=outcome.verdict, seconds=outcome.seconds, reason=outcome.reason,
                          error_type=outcome.error_type, **base)
    return outcome


def start_backend(backend: Loaded, case: Case, ref: Reference, config: RunConfig,
                  executor: Executor) -> Callable[[], CaseResult]:
    """Encode `case` for `backend` and submit the call to `executor`; the function returned waits for
    the outcome and judges it. Calls to different worker processes overlap. Never raises for the
    backend's faults."""
    base = _identity(backend, case, config)
    pending = _submit(backend, case, config, executor, base)
    return lambda: _finished(pending(), ref, backend.contract, config, executor, base)


def _submit(backend: Loaded, case: Case, config: RunConfig, executor: Executor,
            base: dict[str, Any]) -> Callable[[], Outcome | CaseResult]:
    """The call of `backend` on `case` submitted to `executor`: what waits for its outcome, or the
    SKIP (ERROR) result when the backend cannot take the case (asking it raised), or ERROR when the
    engine's own copies of its inputs (encoded, made private, shipped) ran out of memory: the case's
    fault, not the run's (campaigns side by side share the GPU: difftest.workflows.fuzz)."""
    try:
        inputs = _prepared(backend, case, config, base)
        if isinstance(inputs, CaseResult):
            return lambda: inputs
        # The case's own tensors must not be the ones handed over: a backend that writes into them
        # would change the case under every backend after it.
        launch = Launch(case.rows, case.max_model_len, config.repeat, config.time or 0)
        return executor.submit(backend, _private(inputs, case), launch)
    except torch.OutOfMemoryError as exc:
        fault = CaseResult(verdict=Verdict.ERROR, seconds=0.0, reason=f"preparing the inputs for the backend and "
                           f"handing them over ran out of memory: {first_line(exc)}",
                           error_type=type(exc).__name__, **base)
        return lambda: fault


def _finished(outcome: Outcome | CaseResult, ref: Reference, contract: Contract, config: RunConfig,
              executor: Executor, base: dict[str, Any], compared: Comparison | None = None) -> CaseResult:
    """The result of a submitted call: as it was when it never ran, its fault, or its judged outputs
    (`compared`: their comparison, when already made)."""
    if isinstance(outcome, CaseResult):
        return outcome
    done = {**base, "isolation": executor.isolation if config.isolated else None, "isolation_note": executor.note}
    if isinstance(outcome, Fault):
        return CaseResult(verdict=outcome.verdict, seconds=outcome.seconds, reason=outcome.reason,
                          error_type=outcome.error_type, **done)
    return _judge(outcome, ref, contract, done, compared)


def _identity(backend: Loaded, case: Case, config: RunConfig) -> dict[str, Any]:
    """The fields every result of `backend` on `case` carries, whatever happens to the call."""
    contract = backend.contract
    longest = max(case.lengths, default=0)
    reach = Reach(tuple(case.meta.get("families", ())), longest, case.pool_bytes, case.batch)
    return dict(backend=backend.name, case=case.name, description=case.describe(), rows=case.rows,
                device=config.device, encoding=config.encoding or contract.length_encoding,
                layout=config.layout or contract.cache_layout, overridden=config.overridden,
                spec=case.meta.get("spec"), gpu=hardware.gpu_description(case.device), reach=reach,
                library=contract.library)


def _prepared(backend: Loaded, case: Case, config: RunConfig, base: dict[str, Any]) -> KernelInputs | CaseResult:
    """The inputs the backend is handed; SKIP when it cannot take the case here (or it cannot be
    encoded for it), ERROR when asking the backend raised."""
    try:
        reason = unsupported_reason(backend, case, config.device)
    except (Exception, SystemExit) as exc:  # a backend's own availability check failing is that backend's fault
        return CaseResult(verdict=Verdict.ERROR, seconds=0.0, reason=f"unavailable_reason raised "
                          f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__, **base)
    if reason:
        return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason, **base)
    try:
        return encode(case, backend.contract, encoding=config.encoding, layout=config.layout)
    except SpecError as exc:
        return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=f"cannot encode: {exc}", **base)


def _private(inputs: KernelInputs, case: Case) -> KernelInputs:
    """`inputs` with every tensor that shares memory with the case's tensors cloned."""
    shared = {t.untyped_storage().data_ptr() for t in vars(case).values() if isinstance(t, torch.Tensor)}
    fields = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    return dataclasses.replace(inputs, **{
        name: t.clone() for name, t in fields.items()
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in shared})


def _judge(execution: Execution, ref: Reference, contract: Contract, base: dict[str, Any],
           compared: Comparison | None = None) -> CaseResult:
    """The verdict of an execution: the first launch's comparison (`compared`, when already made), the
    inputs, the launches' agreement."""
    got = execution.outputs[0]
    measured = {"mutated_inputs": execution.mutated, "seconds": execution.seconds, "timing": execution.timing}
    try:
        result = compared or compare(ref.logits, got, ref.row_lens, contract, ref.bound, next_n=ref.next_n)
    except ValueError as exc:
        return CaseResult(verdict=Verdict.ERROR, reason=str(exc), error_type=type(exc).__name__, **measured, **base)
    verdicts = [result.verdict] + ([Verdict.FAIL_MUTATED_INPUT] if execution.mutated else [])
    stability = None
    if len(execution.outputs) > 1:
        stability = classify_stability(execution.outputs, ref.logits, ref.row_lens, contract, ref.bound)
        if stability.kind == StabilityKind.UNSTABLE:
            verdicts.append(Verdict.FAIL_NONDETERMINISTIC)
    return CaseResult(verdict=worst(verdicts), comparison=result, stability=stability, **measured, **base)


def run(backends: list[Backend], cases: Iterable[Case | Batch], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None, done: Done | None = None,
        takes: Takes | None = None, on_done: Callable[[Case | Batch], None] | None = None,
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
    compute. `on_done` hears each item once all its results are in. Every fresh result goes through
    `amend` (when given) before it reaches `on_result`.
    """
    loaded = _checked(backends, config)
    results: list[CaseResult] = []
    items = iter(cases)
    with executors_for(loaded, config) as where:
        item = _next_item(items)
        while item is not None:
            whole = item.case if isinstance(item, Batch) else item
            chosen = [i for i, b in enumerate(loaded) if takes is None or takes(b.name, whole)]
            picked = [loaded[i] for i in chosen], [where[i] for i in chosen]
            if isinstance(item, Batch):
                finish = _started_batch(*picked, item, config, on_result, amend)
                following = _next_item(items, finish)  # drawn while the workers compute
                results += finish()
            else:
                results += _run_case(*picked, item, config, on_result, done or {}, amend)
                following = None  # a single case may be large: the next one is drawn after it, not beside it
            if on_done:
                on_done(item)
            item = following if isinstance(item, Batch) else _next_item(items)
    return results


def _next_item(items: Iterator[Case | Batch],
               in_flight: Callable[[], list[CaseResult]] | None = None) -> Case | Batch | None:
    """The next case or batch, None at the end. Should drawing it fail while a batch is in flight, that
    batch is finished first (its results reach on_result) and the error goes on."""
    try:
        item = next(items, None)
    except Exception:  # an interrupt goes on at once, as it does while a batch's answers are awaited
        if in_flight is not None:
            in_flight()
        raise
    require(item is None or isinstance(item, (Case, Batch)), "cases", type(item).__name__,
            "difftest.Case objects (or difftest.engine.batch.Batch)")
    return item


def _started_batch(backends: list[Loaded], executors: list[Executor], batch: Batch, config: RunConfig,
                   on_result: Callable[[CaseResult], None] | None,
                   amend: Amend | None) -> Callable[[], list[CaseResult]]:
    """Every backend's launch on the batch's merged case submitted and the oracle's answer made; what
    finishes the batch: each member judged on its own rows, in (member, backend) order. A member that
    fails there is tried again (_retried), and the retry's result is the one that counts; one that
    fails in the batch but passes when tried again is kept in batch.diverged, and its backend's result
    on the merged case in batch.whole. A Batch is never a resumed pair (`done`)."""
    merged = batch.validate().case.to(config.device)
    bases = [_identity(b, merged, config) for b in backends]
    pending = [_submit(b, merged, config, e, base) for b, e, base in zip(backends, executors, bases, strict=True)]
    try:
        ref = make_reference(merged, config.oracle_kind)  # while the workers compute
    except torch.OutOfMemoryError:
        return lambda: _members_alone(backends, executors, batch, config, on_result, pending, amend)
    return lambda: _finished_batch(backends, executors, batch, config, on_result, [wait() for wait in pending],
                                   ref, bases, amend)


def _members_alone(backends: list[Loaded], executors: list[Executor], batch: Batch, config: RunConfig,
                   on_result: Callable[[CaseResult], None] | None,
                   pending: list[Callable[[], Outcome | CaseResult]], amend: Amend | None) -> list[CaseResult]:
    """The batch's members run one by one, each with an oracle of its own size, when the merged case's
    oracle ran out of memory; the launches on the merged case are waited for first and dropped."""
    for wait in pending:
        wait()
    return [result for member in batch.members
            for result in _run_case(backends, executors, member, config, on_result, {}, amend)]


def _finished_batch(backends: list[Loaded], executors: list[Executor], batch: Batch, config: RunConfig,
                    on_result: Callable[[CaseResult], None] | None, outcomes: list[Outcome | CaseResult],
                    ref: Reference, bases: list[dict[str, Any]], amend: Amend | None) -> list[CaseResult]:
    shares = [batch.reference_of(ref, index) for index in range(len(batch.members))]
    in_batch = [_members_judged(backend, executor, outcome, batch, ref, config)
                for backend, executor, outcome in zip(backends, executors, outcomes, strict=True)]
    retried = [_retried(backend, executor, batch, shares, first, config, amend)
               for backend, executor, first in zip(backends, executors, in_batch, strict=True)]
    results = []
    for index in range(len(batch.members)):
        for b, backend in enumerate(backends):
            result, again = in_batch[b][index], retried[b].get(index)
            if again is not None:
                if result is not None and not again.verdict.failed:
                    batch.diverged.append(result)
                    if backend.name not in batch.whole:
                        batch.whole[backend.name] = _finished(outcomes[b], ref, backend.contract, config,
                                                              executors[b], bases[b])
                result = again
            if on_result:
                on_result(result)
            results.append(result)
    return results


# How many times a batch's failed members are run again together, in a batch of their own, before
# those that still fail are run alone. A kernel whose answer depends on its neighbours in the launch
# (DeepGEMM's row after an empty request: a member ending in empty requests spoils the next member's
# first one) fails about a third of a campaign's members in their batch; one launch for all of them,
# where most have other neighbours, replaces most of their one-by-one re-runs. Each round launches them
# in the reverse order of the round before, so that every member has other neighbours than in the last
# launch. The same rule as the first batch: a member that passes in a batch counts as passing.
REBATCH_ROUNDS = 2
# A batch's members run alone that are in flight at once, where the executor queues (a worker over CUDA
# IPC: a call's message is a few handles). Members are small cases (the batch caps), so their shipped
# inputs stay small; with two in flight, the worker waited for this process to take each answer.
RERUNS_IN_FLIGHT = 8


def _retried(backend: Loaded, executor: Executor, batch: Batch, shares: list[Reference],
             in_batch: list[CaseResult | None], config: RunConfig, amend: Amend | None) -> dict[int, CaseResult]:
    """Member index -> `backend`'s result on it tried again, for each member the batch failed (or gave no
    result). Failed members go into a batch of their own while that leaves fewer failing (at most
    REBATCH_ROUNDS times); those still failing, and those without a result, are run alone. The oracle's
    rows do not depend on the rest of the batch (each row is its own sequence's logits): a member's
    share of the batch's answer is its answer alone. Each launch is recorded in batch.retries."""
    settled: dict[int, CaseResult] = {}
    failing = [index for index, result in enumerate(in_batch) if result is not None and result.verdict.failed]
    for round_index in range(REBATCH_ROUNDS):
        if len(failing) < 2:
            break
        order = failing[::-1] if round_index % 2 else failing
        again = dict(zip(order, _rebatched(backend, executor, batch, shares, order, config), strict=True))
        still = [index for index in failing if again[index] is None or again[index].verdict.failed]
        batch.retries.append(Retry(backend.name, len(failing), len(still)))
        settled.update((index, again[index]) for index in failing if index not in still)
        if len(still) == len(failing):
            break
        failing = still
    alone = sorted(failing + [index for index, result in enumerate(in_batch) if result is None])
    members = [(batch.members[index], shares[index]) for index in alone]
    settled.update(zip(alone, _each_alone(backend, executor, members, config, amend), strict=True))
    batch.retries.extend(Retry(backend.name, 1, int(settled[index].verdict.failed)) for index in alone)
    return settled


def _rebatched(backend: Loaded, executor: Executor, batch: Batch, shares: list[Reference], chosen: list[int],
               config: RunConfig) -> list[CaseResult | None]:
    """`backend`'s result on each chosen member (already validated with the batch), in one launch of
    those members alone together (None: that launch gave no result). The oracle is not run again: its
    answer for them is their shares of the batch's answer, laid end to end (batch.joined)."""
    again = merge([batch.members[index] for index in chosen])
    case = again.case.to(config.device)
    pending = _submit(backend, case, config, executor, _identity(backend, case, config))
    ref = joined([shares[index] for index in chosen], case.max_model_len)
    return _members_judged(backend, executor, pending(), again, ref, config)


def _each_alone(backend: Loaded, executor: Executor, members: list[tuple[Case, Reference]],
                config: RunConfig, amend: Amend | None) -> list[CaseResult]:
    """`backend` on each member alone, in order. Where the executor queues, several calls are in flight at
    once (_outcomes_in_turn). Their first launches' outputs are compared in one pass, laid end to end
    (_compared_together); a member that fails there is compared again alone, for its full comparison."""
    cases = [member.to(config.device) for member, _share in members]  # validated with their batch
    bases = [_identity(backend, case, config) for case in cases]
    outcomes = list(_outcomes_in_turn(backend, executor, cases, bases, config))
    shares = [share for _member, share in members]
    compared = _compared_together(backend, cases, shares, outcomes)
    return [_amended(_finished(outcome, share, backend.contract, config, executor, base, comparison), backend,
                     case, executor, amend)
            for case, share, outcome, base, comparison in zip(cases, shares, outcomes, bases, compared, strict=True)]


def _outcomes_in_turn(backend: Loaded, executor: Executor, cases: list[Case], bases: list[dict[str, Any]],
                      config: RunConfig) -> Iterator[Outcome | CaseResult]:
    """The outcome of `backend` on each case, in order; where the executor queues, up to RERUNS_IN_FLIGHT
    calls are sent before the first of them is awaited, so the worker goes from one call to the next
    while this process takes the answers."""
    window = RERUNS_IN_FLIGHT if executor.queues else 1
    in_flight: collections.deque[Callable[[], Outcome | CaseResult]] = collections.deque()
    for case, base in zip(cases, bases, strict=True):
        if len(in_flight) == window:
            yield in_flight.popleft()()
        in_flight.append(_submit(backend, case, config, executor, base))
    while in_flight:
        yield in_flight.popleft()()


def _compared_together(backend: Loaded, cases: list[Case], shares: list[Reference],
                       outcomes: list[Outcome | CaseResult]) -> list[Comparison | None]:
    """The comparison of each case's first output, made in one compare_spans pass over the outputs and
    oracle answers laid end to end (padded with -inf to the widest max_model_len: past a case's own
    width nothing is inside a window, and -inf is what every mask convention allows there); None where
    a case fails there (compare it alone, for its full comparison) or cannot be laid out with the others
    (no output, or an output of another shape, dtype or device)."""
    firsts = {i: o.outputs[0] for i, (case, o) in enumerate(zip(cases, outcomes, strict=True))
              if isinstance(o, Execution) and tuple(o.outputs[0].shape) == (case.rows, case.max_model_len)}
    fits = list(firsts)
    if len({(out.dtype, out.device) for out in firsts.values()}) != 1 or len(fits) < 2:
        return [None] * len(cases)
    width = max(cases[i].max_model_len for i in fits)
    spans = list(zip(itertools.accumulate((cases[i].rows for i in fits[:-1]), initial=0),
                     (cases[i].rows for i in fits), strict=True))
    expected = torch.cat([padded(shares[i].logits, width) for i in fits])
    got = torch.cat([padded(firsts[i], width) for i in fits])
    together = compare_spans(expected, got, torch.cat([shares[i].row_lens for i in fits]), backend.contract,
                             torch.cat([shares[i].bound for i in fits]), spans)
    compared: list[Comparison | None] = [None] * len(cases)
    for index, comparison in zip(fits, together, strict=True):
        compared[index] = comparison if comparison is not None and not comparison.verdict.failed else None
    return compared


def _members_judged(backend: Loaded, executor: Executor, outcome: Outcome | CaseResult, batch: Batch,
                    ref: Reference, config: RunConfig) -> list[CaseResult | None]:
    """Each member's result from its rows of the batch's outputs, their comparisons made in one pass
    over the first launch's output; all None when the call gave no outputs."""
    if not isinstance(outcome, Execution):
        return [None] * len(batch.members)
    got = outcome.outputs[0]
    compared: list[Comparison | None] = [None] * len(batch.members)  # None: compare each alone
    if tuple(got.shape) == tuple(ref.logits.shape):
        compared = compare_spans(ref.logits, got, ref.row_lens, backend.contract, ref.bound, batch.spans)
    return [_finished(batch.execution_of(outcome, index), batch.reference_of(ref, index), backend.contract, config,
                      executor, _identity(backend, member, config), compared[index])
            for index, member in enumerate(batch.members)]


def _run_case(backends: list[Loaded], executors: list[Executor], case: Case, config: RunConfig,
              on_result: Callable[[CaseResult], None] | None, done: Done, amend: Amend | None) -> list[CaseResult]:
    todo = [i for i, b in enumerate(backends) if (b.name, case.name) not in done]
    fresh: dict[int, CaseResult] = {}
    if todo:
        case = case.validate().to(config.device)
        for index, result in _oracle_and_results(backends, executors, case, config, todo):
            fresh[index] = _amended(result, backends[index], case, executors[index], amend)
            if on_result:
                on_result(fresh[index])
    return [fresh[i] if i in fresh else done[(b.name, case.name)] for i, b in enumerate(backends)]


def _oracle_and_results(backends: list[Loaded], executors: list[Executor], case: Case, config: RunConfig,
                        todo: list[int]) -> Iterator[tuple[int, CaseResult]]:
    """The oracle's answer on `case`, then (index, result) of each backend in `todo`; when the oracle runs
    out of memory (a large case on a GPU other campaigns share), no backend runs and each result is a
    SKIP that says why: there is nothing to judge an output against, and the run goes on."""
    try:
        ref = make_reference(case, config.oracle_kind)
    except torch.OutOfMemoryError as exc:
        reason = f"the oracle ran out of memory on this case, so no backend ran: {first_line(exc)}"
        for index in todo:
            yield index, CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason,
                                    **_identity(backends[index], case, config))
        return
    yield from _results(backends, executors, case, ref, config, todo)


def _results(backends: list[Loaded], executors: list[Executor], case: Case, ref: Reference, config: RunConfig,
             todo: list[int]) -> Iterator[tuple[int, CaseResult]]:
    """(index, result) of each backend in `todo`, in order. Every call is submitted before any is
    waited for, so workers compute side by side, unless what the calls hold together (call_bytes: the
    workers' copies of the inputs, their outputs and their declared working memory) would take more than
    SIDE_BY_SIDE_MEMORY of the GPU's free memory: then one call at a time (on the H200, seven backends'
    8 GiB outputs of a 2^31-logit case ran out of memory)."""
    sizes = CallSizes.of_case(case)
    together = sum(call_bytes(sizes, backends[index].contract).total for index in todo)
    if config.device == "cuda" and together > SIDE_BY_SIDE_MEMORY * hardware.free_memory():
        for index in todo:
            yield index, start_backend(backends[index], case, ref, config, executors[index])()
        return
    started = {index: start_backend(backends[index], case, ref, config, executors[index]) for index in todo}
    for index in todo:
        yield index, started.pop(index)()  # popped: that call's inputs are freed with its closure


def _checked(backends: list[Backend], config: RunConfig) -> list[Loaded]:
    """The backends with their origins; SpecError for one that is not a backend, or a device this machine lacks."""
    loaded = [as_loaded(backend, f"backends[{index}]") for index, backend in enumerate(backends)]
    for index, backend in enumerate(loaded):
        require(isinstance(backend.contract, Contract), f"backends[{index}].contract", backend.contract,
                "a difftest.Contract")
    require(config.device != "cuda" or hardware.cuda_unavailable_reason() is None, "device", config.device,
            f"a device torch can see ({hardware.CUDA_UNAVAILABLE})")
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


def _amended(result: CaseResult, backend: Loaded, case: Case, executor: Executor, amend: Amend | None) -> CaseResult:
    return amend(result, backend, case, executor) if amend else result
