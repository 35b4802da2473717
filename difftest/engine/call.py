"""One backend on one case: its inputs encoded and submitted, its outcome judged into a CaseResult.

A backend that raises gets ERROR, one that cannot take a case gets SKIP with the reason. Running out
of memory is the harness's problem before it is the backend's: a call that ran out (in the kernel, or
in the engine's own copies of its inputs, or judging its output) while other calls held memory beside
it comes back as OutOfMemory, for the caller to try it again alone (difftest.engine.runner); one that
ran out alone is a SKIP that says how many bytes it needed and how many were free. No correct kernel
gets a verdict from memory pressure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from difftest.backends import Backend, Loaded, as_loaded
from difftest.core import hardware, memory
from difftest.core.case import Case
from difftest.core.contract import Contract
from difftest.core.errors import SpecError, first_line
from difftest.core.kernel_inputs import KernelInputs, encode
from difftest.core.verdict import Verdict, worst
from difftest.engine.comparison import Comparison, compare
from difftest.engine.config import RunConfig
from difftest.engine.guards import Execution, Fault, Launch, Outcome, formatted_traceback
from difftest.engine.isolate import Executor, InProcess, release_cache
from difftest.engine.result import CallMemory, CaseResult, Reach
from difftest.engine.stability import StabilityKind, classify_stability
from difftest.oracles.reference import Reference, make_reference

# A step every fresh result goes through before it is reported, with the executor its backend ran in: the
# metamorphic relations (more launches of the backend, where it runs) and the compute-sanitizer replay of a
# failing result, which needs a bundle, a record the engine does not write (difftest.workflows.running).
Amend = Callable[[CaseResult, Loaded, Case, Executor], CaseResult]


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
    """A call that ran out of memory while other calls held memory beside it: what ran out (the
    backend's call, preparing its inputs, judging its output), the error's line, and its time."""

    what: str
    error: str
    seconds: float

    def describe(self) -> str:
        return f"{self.what} ran out of memory beside other calls ({self.error})"


Pending = Callable[[], Outcome | CaseResult | OutOfMemory]  # waits for a submitted call


def unsupported_reason(backend: Backend, case: Case, device: str) -> str | None:
    """Why `backend` cannot take `case` on `device`, or None."""
    return backend.unavailable_reason(device) or backend.contract.accepts(case, device)


def run_one(backend: Backend, case: Case, config: RunConfig, executor: Executor | None = None,
            amend: Amend | None = None) -> CaseResult:
    """One backend on one case, on config.device, against a fresh oracle answer; the backend runs in
    `executor` (one of difftest.engine.runner.executors_for's), else in this process; the result goes
    through `amend`. It runs alone: out of memory, it is a SKIP with the numbers."""
    case = case.to(config.device)
    loaded = as_loaded(backend)
    where = executor or InProcess()
    result = start_backend(loaded, case, make_reference(case, config.oracle_kind), config, where)()
    return amend(result, loaded, case, where) if amend else result


def launch(backend: Loaded, case: Case, config: RunConfig, executor: Executor) -> Execution | CaseResult:
    """One call of `backend` on `case` in `executor`, alone, encoded and guarded as every call is (config.repeat
    launches), and not judged: its outputs, or the result that says why there are none (SKIP, ERROR, CRASH,
    TIMEOUT). What a check that needs no oracle compares (difftest.engine.metamorphic, .consensus)."""
    base = identity(backend, case, config)
    outcome = submit(backend, case, config, executor, base)()
    if isinstance(outcome, Execution):
        return outcome
    # No output, so nothing is judged: settle() reads no reference for a fault or a result made already.
    return settled_alone(settle(outcome, None, backend.contract, config, executor, base),  # type: ignore[arg-type]
                         backend, case, config)


def judged(backend: Loaded, case: Case, config: RunConfig, execution: Execution, ref: Reference,
           executor: Executor, contract: Contract | None = None) -> CaseResult:
    """The result of `launch`'s execution of `backend` on `case`, judged against `ref` (an oracle's answer, or
    another backend's: difftest.engine.consensus) under `contract` (default: the backend's)."""
    base = identity(backend, case, config)
    judged_here = settle(execution, ref, contract or backend.contract, config, executor, base)
    return settled_alone(judged_here, backend, case, config)


def start_backend(backend: Loaded, case: Case, ref: Reference, config: RunConfig,
                  executor: Executor) -> Callable[[], CaseResult]:
    """Encode `case` for `backend` and submit the call to `executor`, to run with no other call beside
    it; the function returned waits for the outcome and judges it. Never raises for the backend's faults."""
    beside = start_beside(backend, case, ref, config, executor)
    return lambda: settled_alone(beside(), backend, case, config)


def start_beside(backend: Loaded, case: Case, ref: Reference, config: RunConfig,
                 executor: Executor) -> Callable[[], CaseResult | OutOfMemory]:
    """start_backend for a call other calls run beside (calls to different worker processes overlap):
    the function returned gives OutOfMemory where the call ran out of memory."""
    base = identity(backend, case, config)
    pending = submit(backend, case, config, executor, base)
    return lambda: settle(pending(), ref, backend.contract, config, executor, base)


def submit(backend: Loaded, case: Case, config: RunConfig, executor: Executor, base: dict[str, Any]) -> Pending:
    """The call of `backend` on `case` submitted to `executor`: what waits for its outcome, or the
    SKIP (ERROR) result when the backend cannot take the case (asking it raised), or OutOfMemory when the
    engine's own copies of its inputs (encoded, made private, shipped) ran out of memory: the case's
    memory, not the backend's fault (campaigns side by side share the GPU: difftest.workflows.fuzz)."""
    try:
        inputs = _prepared(backend, case, config, base)
        if isinstance(inputs, CaseResult):
            return lambda: inputs
        # The case's own tensors must not be the ones handed over: a backend that writes into them
        # would change the case under every backend after it.
        launch = Launch(case.rows, case.max_model_len, config.repeat, config.time or 0)
        return executor.submit(backend, _private(inputs, case), launch)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        out = OutOfMemory("preparing its inputs", f"{type(exc).__name__}: {first_line(exc)}", 0.0)
        return lambda: out


def settle(outcome: Outcome | CaseResult | OutOfMemory, ref: Reference, contract: Contract, config: RunConfig,
           executor: Executor, base: dict[str, Any], compared: Comparison | None = None) -> CaseResult | OutOfMemory:
    """The result of a submitted call: as it was when it never ran, its fault, or its judged outputs
    (`compared`: their comparison, when already made); OutOfMemory where the call, or judging it, ran out."""
    if isinstance(outcome, (CaseResult, OutOfMemory)):
        return outcome
    done = {**base, "isolation": executor.isolation if config.isolated else None, "isolation_note": executor.note}
    if isinstance(outcome, Fault):
        if memory.is_out_of_memory(outcome.error_type, outcome.reason):
            return OutOfMemory("its call", outcome.reason.partition("\n")[0], outcome.seconds)
        return CaseResult(verdict=outcome.verdict, seconds=outcome.seconds, reason=outcome.reason,
                          error_type=outcome.error_type, traceback=outcome.traceback, **done)
    try:
        return _judge(outcome, ref, contract, done, compared)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        return OutOfMemory("judging its output", f"{type(exc).__name__}: {first_line(exc)}", outcome.seconds)


def finished(outcome: Outcome | CaseResult | OutOfMemory, ref: Reference, backend: Loaded, case: Case,
             config: RunConfig, executor: Executor, base: dict[str, Any],
             compared: Comparison | None = None) -> CaseResult:
    """settle() for a call that ran alone: running out of memory is a SKIP with the numbers."""
    return settled_alone(settle(outcome, ref, backend.contract, config, executor, base, compared), backend, case,
                         config)


def settled_alone(result: CaseResult | OutOfMemory, backend: Loaded, case: Case, config: RunConfig,
                  counted: int | None = None) -> CaseResult:
    """`result`, or for a call that ran out of memory with no other call beside it, a SKIP whose reason
    gives what it needs (counted by the side-by-side rule, or call_bytes) and what is free now."""
    if not isinstance(result, OutOfMemory):
        return result
    if config.device == "cuda":
        release_cache()  # what this process keeps cached is free for the next call, not held from it
    shape = memory.Shape.of_case(case)
    call = memory.call_bytes(shape, backend.contract)
    need = max(counted or 0, call.total)
    how = call.describe() if need == call.total else f"as its earlier calls were measured; {call.describe()}"
    free = hardware.available_memory(config.device)
    shown = "not known" if free is None else memory.size_text(free)
    reason = (f"out of memory with no other call beside it: {result.what} ran out ({result.error}); it needs about "
              f"{memory.size_text(need)} ({how}), {shown} free on {config.device} now")
    return CaseResult(verdict=Verdict.SKIP, seconds=result.seconds, reason=reason,
                      memory=CallMemory(counted=need, alone=True, ran_out=True), **identity(backend, case, config))


def identity(backend: Loaded, case: Case, config: RunConfig) -> dict[str, Any]:
    """The fields every result of `backend` on `case` carries, whatever happens to the call."""
    contract = backend.contract
    longest = max(case.lengths, default=0)
    reach = Reach(_families(case, backend.name), longest, case.pool_bytes, case.batch)
    return dict(backend=backend.name, case=case.name, description=case.describe(), rows=case.rows,
                device=config.device, encoding=config.encoding or contract.length_encoding,
                layout=config.layout or contract.cache_layout, overridden=config.overridden,
                spec=case.meta.get("spec"), gpu=hardware.gpu_description(case.device), reach=reach,
                library=contract.library)


def _families(case: Case, backend: str) -> tuple[str, ...]:
    """The edge families `case` reaches for `backend`: its own plan's claims where the plan says
    (difftest.engine.plan.PlannedCase.reach), else the case's."""
    own = case.meta.get("reach")
    return tuple(own.get(backend, ())) if isinstance(own, dict) else tuple(case.meta.get("families", ()))


def _prepared(backend: Loaded, case: Case, config: RunConfig, base: dict[str, Any]) -> KernelInputs | CaseResult:
    """The inputs the backend is handed; SKIP when it cannot take the case here (or it cannot be
    encoded for it), ERROR when asking the backend raised."""
    try:
        reason = unsupported_reason(backend, case, config.device)
    except (Exception, SystemExit) as exc:  # a backend's own availability check failing is that backend's fault
        return CaseResult(verdict=Verdict.ERROR, seconds=0.0, reason=f"unavailable_reason raised "
                          f"{type(exc).__name__}: {exc}", error_type=type(exc).__name__,
                          traceback=formatted_traceback(exc), **base)
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
    inputs, the launches' agreement; what the call was measured to allocate, when it was."""
    got = execution.outputs[0]
    measured = {"mutated_inputs": execution.mutated, "seconds": execution.seconds, "timing": execution.timing,
                "memory": None if execution.peak_bytes is None else CallMemory(measured=execution.peak_bytes)}
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


def amended(result: CaseResult, backend: Loaded, case: Case, executor: Executor, amend: Amend | None) -> CaseResult:
    """`result` through the caller's amend step, when there is one."""
    return amend(result, backend, case, executor) if amend else result
