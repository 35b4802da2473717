"""The runner of an operation handed in (difftest.core.operation.Operation): every drawn case through the
operation's oracle once per contract, then through every backend, one verdict each.

A backend that raises gets ERROR (its exception, its traceback) and the run goes on; one that cannot take a
case here (unavailable, or its contract refuses the case) gets SKIP with the reason; an output the
operation's comparison cannot read (the wrong shape) is ERROR with the comparison's words; an oracle or a
comparison that raises is ERROR too ('checking the output: ...'). Running out of memory earns no kernel a
verdict: a case that could not be drawn or moved to the device (NotDrawn), a call that ran out (in-process or
in its worker) and a check that ran out are each a SKIP that says so, and the run goes on. Results reach
`on_result` as each is made.

With RunConfig.metamorphic, each judged result then has the operation's relations checked on its case
(Operation.relate; top-k's in difftest.engine.topk_metamorphic, ragged logits' in
difftest.engine.ragged_metamorphic), each related case called where the case was:
a relation that does not hold makes the result FAIL(metamorphic), unless the oracle's verdict is worse, and
the violations (the relation, the related case) go into it.

Under isolation (RunConfig.isolated: --isolate, the default on a GPU) each backend's calls run in a worker
process of its own (difftest.engine.isolate.OperationWorker): a backend that kills its process (a segfault,
an abort) gets CRASH with the signal and its stderr's tail, one that outlasts the run's timeout gets TIMEOUT
(its worker killed), and the run goes on with a fresh worker. The oracle and the comparison stay in the run's
process. A backend that cannot be pickled runs in-process, and its results' isolation note says why. Without
isolation a backend that kills the process ends the run: the results streamed before it are kept.

Every call is guarded as the paged runner guards its calls (difftest.engine.guards.GuardedCall, the pieces the
operation declares: Operation.output, .stability, .watched): RunConfig.repeat launches, their outputs compared
(Operation.stability: a top-k's other choices among tied values are stable within tolerance, ragged logits'
values within the contract's tolerance; unstable is FAIL(nondeterministic)); an input the backend wrote into
is FAIL(mutated-input), naming it; its fresh float tensors start as poison; an output that is not the tensor
the contract declares (dtype, shape, device; a None, a list) is ERROR saying what came back, never judged.

The paged-logits operation keeps its own runner (difftest.engine.runner: batches, the memory model, worker
isolation, stability and timing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from difftest.core import memory
from difftest.core.errors import first_line, require
from difftest.core.kinds import RELATIONS, Isolation
from difftest.core.lifetime import run_folder
from difftest.core.operation import Operation
from difftest.core.verdict import Verdict, worst
from difftest.engine.config import RunConfig
from difftest.engine.guards import Fault, GuardedCall, Launches, called_here, formatted_traceback, raised_by_backend
from difftest.engine.isolate import DEFAULT_TIMEOUT, Called, OperationWorker, cannot_pickle
from difftest.engine.result import CaseResult, Judgement
from difftest.engine.runner import NotDrawn
from difftest.engine.stability import StabilityKind


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A case as drawn, with what the report keeps of where it came from."""

    case: Any  # or the NotDrawn of a case whose tensors ran out of memory: a SKIP for each backend
    spec: dict[str, object] | None = None  # the spec's JSON, when it was drawn from one
    backends: tuple[str, ...] | None = None  # the backends the plan chose for it; None: every one


References = list[tuple[Any, Any]]  # (contract, the oracle's answer under it) for one case


@dataclasses.dataclass(frozen=True)
class Named:
    """A backend of the operation and the name the run calls it by."""

    name: str
    backend: Any  # .contract, .unavailable_reason(device), called by Operation.call


def run_operation(op: Operation, backends: list[Named], cases: Iterable[Drawn], config: RunConfig,
                  on_result: Callable[[CaseResult], None] | None = None,
                  workers: Workers | None = None) -> list[CaseResult]:
    """Every chosen backend on every case, results in (case, backend) order; under isolation in the workers of
    `workers` (a campaign's, kept across its calls), else of workers made for this run."""
    if config.isolated and workers is None:
        with operation_workers(op, config) as made:
            return run_operation(op, backends, cases, config, on_result, made)
    results = []
    for drawn in cases:
        case = _on_device(drawn, config.device)
        references: References = []  # the oracle's answer under each contract seen on this case
        for named in backends:
            if drawn.backends is not None and named.name not in drawn.backends:
                continue
            result = (_not_drawn(op, named, case, config) if isinstance(case, NotDrawn)
                      else run_one(op, named, case, config, drawn.spec, references, workers))
            if on_result:
                on_result(result)
            results.append(result)
    return results


def _on_device(drawn: Drawn, device: str) -> Any:
    """The drawn case, checked and on `device`; a NotDrawn when it is one or moving it ran out of memory."""
    if isinstance(drawn.case, NotDrawn):
        return drawn.case
    try:
        return drawn.case.validate().to(device)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        return NotDrawn(drawn.case.name, drawn.case.describe(), drawn.case.rows,
                        f"moving the case to {device}: {first_line(exc)}", drawn.spec)


def _not_drawn(op: Operation, named: Named, case: NotDrawn, config: RunConfig) -> CaseResult:
    """The SKIP of a backend on a case that ran out of memory before any backend was called."""
    return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=f"the case ran out of memory before any call "
                      f"({case.reason}): no verdict", backend=named.name, case=case.name,
                      description=case.description, rows=case.rows, device=config.device, encoding=None, layout=None,
                      overridden=False, spec=case.spec, library=named.backend.contract.library, operation=op.kind)


class Workers:
    """The worker of each backend of one isolated run (made on its first call), or why it runs in-process."""

    def __init__(self, op: Operation, config: RunConfig, log_dir: Path) -> None:
        self.op, self.config, self.log_dir = op, config, log_dir
        self.made: dict[str, OperationWorker | str] = {}

    def worker(self, named: Named) -> OperationWorker | str:
        """`named`'s worker, or why it has none (the backend cannot be pickled)."""
        if named.name not in self.made:
            why = cannot_pickle(self.op.call, named.backend)
            call = guarded(self.op, self.config, private=False).call  # the worker's case is its own
            self.made[named.name] = f"the backend cannot travel to a worker process ({why}); it ran in-process" \
                if why else OperationWorker(call, named.backend, self.config.device,
                                            self.config.timeout or DEFAULT_TIMEOUT, self.log_dir / str(len(self.made)),
                                            self.config.startup_timeout)
        return self.made[named.name]

    def close(self, kill: bool = False) -> None:
        """Let every worker exit (kill each, when the run was stopped: one may be mid-call), and remove their
        logs."""
        for worker in self.made.values():
            if isinstance(worker, OperationWorker):
                worker.kill() if kill else worker.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)


@contextlib.contextmanager
def operation_workers(op: Operation, config: RunConfig) -> Iterator[Workers | None]:
    """The run's Workers when it is isolated (closed when the block ends), else None."""
    if not config.isolated:
        yield None
        return
    workers = Workers(op, config, Path(tempfile.mkdtemp(prefix="difftest-operation-workers-", dir=run_folder())))
    stopped = True  # until the block ends by itself: a stop (Ctrl-C, SIGTERM) must not wait on a kernel mid-call
    try:
        yield workers
        stopped = False
    finally:
        workers.close(kill=stopped)


def run_one(op: Operation, named: Named, case: Any, config: RunConfig, spec: dict[str, object] | None = None,
            references: References | None = None, workers: Workers | None = None) -> CaseResult:
    """One backend on one case (on the run's device), judged against the operation's oracle, then the run's
    relations checked on it; under isolation the calls run in the backend's worker of `workers` (a run's; one
    made for this call when None). SpecError naming `metamorphic` for relations the operation has not."""
    if config.isolated and workers is None:
        with operation_workers(op, config) as made:
            return run_one(op, named, case, config, spec, references, made)
    relations_asked(op, config)
    references = [] if references is None else references
    contract = named.backend.contract
    base = dict(backend=named.name, case=case.name, description=case.describe(), rows=case.rows, device=config.device,
                encoding=None, layout=None, overridden=False, spec=spec, library=contract.library, operation=op.kind)
    reason = named.backend.unavailable_reason(config.device) or contract.accepts(case, config.device)
    if reason:  # never called: no isolation to report, as the paged runner's SKIPs
        return CaseResult(verdict=Verdict.SKIP, seconds=0.0, reason=reason, **base)
    worker = workers.worker(named) if workers is not None else None
    in_process_note = worker if isinstance(worker, str) else None
    isolation = None if worker is None else Isolation.IN_PROCESS if in_process_note else Isolation.WORKER
    base.update(isolation=isolation, isolation_note=in_process_note)
    called = worker(case) if isinstance(worker, OperationWorker) else _called(guarded(op, config), named, case,
                                                                                config.device)
    if isinstance(called, Fault) and memory.is_out_of_memory(called.error_type, called.reason):
        return CaseResult(verdict=Verdict.SKIP, seconds=called.seconds, reason=f"the call ran out of memory "
                          f"({called.reason.partition(chr(10))[0]}): no verdict", **base)
    if isinstance(called, Fault):  # raised, crashed or hung: its verdict, and the run goes on
        return CaseResult(verdict=called.verdict, seconds=called.seconds, reason=called.reason,
                          error_type=called.error_type, traceback=called.traceback, **base)
    launches: Launches = called.output
    seconds = called.seconds
    base.update(mutated_inputs=launches.mutated)
    if launches.violation:  # not the output the contract declares: nothing to judge
        return CaseResult(verdict=Verdict.ERROR, seconds=seconds, reason=launches.violation, error_type="contract",
                          **base)
    got = launches.outputs[0]
    try:
        reference = _reference(op, case, contract, config, references)
        judged: Judgement = op.judge(reference, got, case, contract)
        stability = op.stability(reference, launches.outputs, case, contract) if len(launches.outputs) > 1 else None
    except ValueError as exc:  # an output the comparison cannot read: the wrong shape
        return CaseResult(verdict=Verdict.ERROR, seconds=seconds, reason=first_line(exc),
                          error_type=type(exc).__name__, **base)
    except Exception as exc:  # the oracle or the comparison could not finish: said, and the run goes on
        if memory.ran_out(exc):
            return CaseResult(verdict=Verdict.SKIP, seconds=seconds, reason=f"checking the output ran out of "
                              f"memory: {first_line(exc)}", **base)
        return CaseResult(verdict=Verdict.ERROR, seconds=seconds, reason=f"checking the output: {first_line(exc)}",
                          error_type=type(exc).__name__, traceback=formatted_traceback(exc), **base)
    verdicts = [judged.verdict] + ([Verdict.FAIL_MUTATED_INPUT] if launches.mutated else []) + (
        [Verdict.FAIL_NONDETERMINISTIC] if stability is not None and stability.kind == StabilityKind.UNSTABLE else [])
    result = CaseResult(verdict=worst(verdicts), seconds=seconds, comparison=judged.comparison,
                        selection=judged.selection, headline=judged.headline, stability=stability, **base)
    return _related(op, named, case, got, result, config, worker)


def guarded(op: Operation, config: RunConfig, private: bool = True) -> Operation:
    """`op` with its call guarded (difftest.engine.guards.GuardedCall: config.repeat launches, inputs checksummed
    and, where `private`, copied from the case, outputs checked against Operation.output): its call returns the
    Launches. The operation's other pieces are unchanged, so the call goes where op.call would go."""
    return dataclasses.replace(op, call=GuardedCall(op.call, op.output, op.watched, config.repeat, private))


def relations_asked(op: Operation, config: RunConfig) -> None:
    """SpecError naming `metamorphic` when the run asks for relations that `op` does not check here."""
    kind = RELATIONS.get(op.kind)
    require(not config.metamorphic or (op.relate is not None and kind is not None
                                       and all(isinstance(r, kind) for r in config.metamorphic)),
            "metamorphic", tuple(r.value for r in config.metamorphic),
            f"relations of the {op.name} operation: {[r.value for r in kind]}" if op.relate and kind
            else f"none: the {op.name} operation has no relations this runner checks")


def _related(op: Operation, named: Named, case: Any, got: Any, result: CaseResult, config: RunConfig,
             worker: OperationWorker | str | None) -> CaseResult:
    """`result` (judged) with the run's relations checked on its case, each related case called as the case was
    (in the backend's worker, else in-process): a violated one is FAIL(metamorphic) unless a worse verdict
    stands, the violations in the result. Checking that raises is an ERROR that says so, out of memory a note."""
    if not config.metamorphic or op.relate is None:
        return result

    def launch(other: Any) -> Called | Fault:
        called = worker(other) if isinstance(worker, OperationWorker) else _called(guarded(op, config), named, other,
                                                                                  config.device)
        return _first_output(called)

    try:
        violations = op.relate(case, got, named.backend.contract, config.metamorphic, launch)
    except Exception as exc:  # deriving or judging a related case could not finish: said, and the run goes on
        if memory.ran_out(exc):
            return dataclasses.replace(result, reason=f"the relations ran out of memory: {first_line(exc)}")
        return dataclasses.replace(result, verdict=Verdict.ERROR, reason=f"checking the relations: {first_line(exc)}",
                                   error_type=type(exc).__name__, traceback=formatted_traceback(exc))
    if not violations:
        return result
    return dataclasses.replace(result, metamorphic=violations, verdict=worst([result.verdict,
                                                                              Verdict.FAIL_METAMORPHIC]))


def _first_output(called: Called | Fault) -> Called | Fault:
    """A guarded call as a relation reads it: its first launch's output, or the ERROR of an output that is not
    what the contract declares."""
    if isinstance(called, Fault):
        return called
    launches: Launches = called.output
    if launches.violation:
        return Fault(Verdict.ERROR, launches.violation, called.seconds, error_type="contract")
    return Called(launches.outputs[0], called.seconds)


def _reference(op: Operation, case: Any, contract: Any, config: RunConfig, references: References) -> Any:
    """The oracle's answer on `case` under `contract`, made once per equal contract. Found by equality, not
    id(): a backend whose contract is a property makes a new object per access, and a freed one's id is
    reused by the next (the ragged oracle's width for one contract was handed to another's output)."""
    for known, answer in references:
        if known == contract:
            return answer
    answer = op.reference(case, contract, config.oracle_kind)
    references.append((contract, answer))
    return answer


def _called(op: Operation, named: Named, case: Any, device: str) -> Called | Fault:
    """The backend's call in this process (guards.called_here: torch's settings kept, a forked copy ended, a stop
    signalled during it a stop): its output, or the Fault (ERROR) of what it raised, SystemExit and a
    KeyboardInterrupt of its own included."""
    started = time.perf_counter()

    def call() -> Any:
        got = op.call(named.backend, case)
        _synchronize(device)
        return got

    try:
        got = called_here(call)
    except Exception as exc:  # the backend raised: its verdict, and the run goes on
        raised = raised_by_backend(exc)
        return Fault(Verdict.ERROR, first_line(exc), time.perf_counter() - started,
                     error_type=type(raised).__name__, traceback=formatted_traceback(raised))
    return Called(got, time.perf_counter() - started)


def _synchronize(device: str) -> None:
    """Wait for the kernels launched: an asynchronous CUDA error belongs to the call that launched it."""
    if device == "cuda":
        import torch  # deferred: the CPU path needs no CUDA

        torch.cuda.synchronize()
