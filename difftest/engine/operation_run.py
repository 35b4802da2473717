"""The runner of an operation handed in (difftest.core.operation.Operation): every drawn case through the
operation's oracle once per contract, then through every backend, one verdict each.

A backend that raises gets ERROR (its exception, its traceback) and the run goes on; one that cannot take a
case here (unavailable, or its contract refuses the case) gets SKIP with the reason; an output the
operation's comparison cannot read (the wrong shape) is ERROR with the comparison's words; an oracle or a
comparison that raises is ERROR too ('checking the output: ...'), or SKIP where it ran out of memory. Results
reach `on_result` as each is made. A backend that kills the process (a segfault, an abort) ends the run: the
results streamed before it are kept, and only paged logits runs its calls in worker processes.

The paged-logits operation keeps its own runner (difftest.engine.runner: batches, the memory model, worker
isolation, stability and timing); this one runs in the run's process: a run that asks for isolation gets each
result's isolation note saying so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from difftest.core.errors import first_line
from difftest.core.kinds import Isolation
from difftest.core.operation import Operation
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.guards import formatted_traceback
from difftest.engine.result import CaseResult, Judgement

IN_PROCESS_NOTE = "an operation other than paged logits runs its calls in the run's process (no worker isolation)"


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A case as drawn, with what the report keeps of where it came from."""

    case: Any
    spec: dict[str, object] | None = None  # the spec's JSON, when it was drawn from one
    backends: tuple[str, ...] | None = None  # the backends the plan chose for it; None: every one


@dataclasses.dataclass(frozen=True)
class Named:
    """A backend of the operation and the name the run calls it by."""

    name: str
    backend: Any  # .contract, .unavailable_reason(device), called by Operation.call


def run_operation(op: Operation, backends: list[Named], cases: Iterable[Drawn], config: RunConfig,
                  on_result: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Every chosen backend on every case, results in (case, backend) order."""
    results = []
    for drawn in cases:
        case = drawn.case.validate().to(config.device)
        references: dict[int, Any] = {}  # id(contract) -> the oracle's answer under it
        for named in backends:
            if drawn.backends is not None and named.name not in drawn.backends:
                continue
            result = run_one(op, named, case, config, drawn.spec, references)
            if on_result:
                on_result(result)
            results.append(result)
    return results


def run_one(op: Operation, named: Named, case: Any, config: RunConfig, spec: dict[str, object] | None = None,
            references: dict[int, Any] | None = None) -> CaseResult:
    """One backend on one case (on the run's device), judged against the operation's oracle."""
    references = {} if references is None else references
    contract = named.backend.contract
    base = dict(backend=named.name, case=case.name, description=case.describe(), rows=case.rows, device=config.device,
                encoding=None, layout=None, overridden=False, spec=spec, library=contract.library, operation=op.kind,
                isolation=Isolation.IN_PROCESS if config.isolated else None,
                isolation_note=IN_PROCESS_NOTE if config.isolated else None)
    reason = named.backend.unavailable_reason(config.device) or contract.accepts(case, config.device)
    if reason:
        return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason, **base)
    started = time.perf_counter()
    try:
        got = op.call(named.backend, case)
        _synchronize(config.device)
    except Exception as exc:  # the backend raised: its verdict, and the run goes on
        return CaseResult(verdict=Verdict.ERROR, seconds=time.perf_counter() - started, reason=first_line(exc),
                          error_type=type(exc).__name__, traceback=formatted_traceback(exc), **base)
    seconds = time.perf_counter() - started
    try:
        if id(contract) not in references:
            references[id(contract)] = op.reference(case, contract, config.oracle_kind)
        judged: Judgement = op.judge(references[id(contract)], got, case, contract)
    except ValueError as exc:  # an output the comparison cannot read: the wrong shape
        return CaseResult(verdict=Verdict.ERROR, seconds=seconds, reason=first_line(exc),
                          error_type=type(exc).__name__, **base)
    except Exception as exc:  # the oracle or the comparison could not finish: said, and the run goes on
        if _out_of_memory(exc):
            return CaseResult(verdict=Verdict.SKIP, seconds=seconds, reason=f"checking the output ran out of "
                              f"memory: {first_line(exc)}", **base)
        return CaseResult(verdict=Verdict.ERROR, seconds=seconds, reason=f"checking the output: {first_line(exc)}",
                          error_type=type(exc).__name__, traceback=formatted_traceback(exc), **base)
    return CaseResult(verdict=judged.verdict, seconds=seconds, comparison=judged.comparison,
                      selection=judged.selection, headline=judged.headline, **base)


def _out_of_memory(exc: Exception) -> bool:
    """Whether `exc` is torch's out-of-memory error (CUDA), or the CPU allocator's."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


def _synchronize(device: str) -> None:
    """Wait for the kernels launched: an asynchronous CUDA error belongs to the call that launched it."""
    if device == "cuda":
        import torch  # deferred: the CPU path needs no CUDA

        torch.cuda.synchronize()
