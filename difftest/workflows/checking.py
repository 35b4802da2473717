"""`check(backend, case)`: one backend on one case against the oracle, as a test assertion, for any operation.

The case says the operation (a paged Case, a TopkCase, a RaggedCase, an indexer case: Operation.case_type), and
the backend must be one of it (its contract's `operation`). A paged case runs through the paged runner
(difftest.workflows.running), any other through the operation runner (difftest.engine.operation_run.run_one),
each judged by its operation's oracle and comparison. A PASS returns the CaseResult; a failure raises
AssertionError whose message is the failure block (for paged logits the row table: rows with the wrong -inf
mask, the first mismatch, the verdict; for another operation its verdict and headline) and the one command
line that replays it; a backend that cannot take the case skips the calling test (pytest.skip) with the reason.
A test runner attaches an Observer (the pytest plugin does) to hear every result and to say where failing cases
leave a reproducer bundle.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from difftest.backends import Loaded, as_loaded, get_backends
from difftest.core.case import Case
from difftest.core.errors import SpecError
from difftest.core.kinds import OperationKind
from difftest.core.operation import Operation
from difftest.core.text import printable
from difftest.core.verdict import Verdict
from difftest.engine import operation_run
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.engine.runner import executors_for
from difftest.operations import OPERATIONS
from difftest.records.bundle import write_bundle
from difftest.records.commands import backend_target, case_command
from difftest.records.commands import replay_command as bundle_replay_command
from difftest.records.report import render_failures
from difftest.workflows.observe import Observer, current_observer
from difftest.workflows.running import run_one


def check(backend: Any, case: Any, config: RunConfig | None = None) -> CaseResult:
    """Run `backend` on `case` and compare with the oracle of the case's operation, row by row.

    `case` is a case of any operation (a paged Case, a TopkCase, a RaggedCase, an IndexerCase, a
    PrefillIndexerCase); `backend` is a backend of that operation: a backend object, a registered name of it
    ("torch", "torch-topk", "torch+torch-topk") or 'package.module:object', or a function decorated with
    difftest.backend(contract=...) (SpecError naming `backend` for one of another operation). `config`
    defaults to the case's device (a paged backend's declared encoding and layout). With `config.isolate` set
    (True, not by default: a worker started per call costs seconds) the backend runs in a worker process.
    Returns the CaseResult of a PASS; raises AssertionError (the failure block, an error's traceback and the
    replay line) for any failure or error; skips the calling test (pytest.skip, with the reason) when
    the backend cannot take the case here.
    """
    __tracebackhide__ = True
    op = operation_of(case)
    config = config or RunConfig(device=case.device.type)
    loaded = operation_backend(op.kind, backend)
    if op.kind == OperationKind.PAGED_LOGITS:
        result = _checked(loaded, case, config)
    else:
        result = _operation_checked(op, loaded, case, config)
    return conclude(loaded, case, result, config)


def conclude(backend: Loaded, case: Any, result: CaseResult, config: RunConfig) -> CaseResult:
    """What check() makes of `backend`'s result on `case` (run as `config` says), wherever it was run: heard by
    the observer, then returned (PASS), skipped (SKIP, pytest.skip with the reason) or raised (any failure: an
    AssertionError of the failure block and its replay line)."""
    __tracebackhide__ = True
    observer = current_observer() or Observer()
    if observer.on_result is not None:
        observer.on_result(result)
    if result.verdict == Verdict.SKIP:
        import pytest  # deferred: check() is also called outside pytest

        pytest.skip(f"{backend.name} cannot take {case.name}: {result.reason}")
    if result.verdict.failed:
        raise AssertionError(failure_message(result, replay_command(backend, case, result, config,
                                                                    observer.repro_dir)))
    return result


def operation_of(case: Any) -> Operation:
    """The operation whose case `case` is (Operation.case_type); SpecError naming `case` for anything else."""
    for op in OPERATIONS.values():
        if isinstance(case, op.case_type):
            return op
    raise SpecError("case", type(case).__name__, f"a case of an operation: one of "
                    f"{[op.case_type.__name__ for op in OPERATIONS.values()]}")


def operation_backend(kind: OperationKind, backend: Any) -> Loaded:
    """The backend of operation `kind` that `backend` is or names (a backend object, a decorated function, a
    registered name or 'package.module:object'), with the origin that loads it again (difftest.backends.registry);
    SpecError naming `backend` for a backend of another operation."""
    if isinstance(backend, str):  # a user backend may also be named as it calls itself (get_backends)
        return get_backends([backend], "backend", kind)[0]
    made = as_loaded(backend, "backend")
    declared = getattr(made.contract, "operation", None)
    if declared != kind:
        said = declared.value if isinstance(declared, OperationKind) else "no"
        raise SpecError("backend", made.name, f"a backend of the {kind.value} operation (the case's): its contract "
                        f"({type(made.contract).__name__}) is of the {said} operation")
    return made


def _operation_checked(op: Operation, backend: Loaded, case: Any, config: RunConfig) -> CaseResult:
    """`backend` on `case` through the operation runner: in a worker only when config.isolate asks for one
    (as a paged check: the runner would isolate every call on a GPU)."""
    config = dataclasses.replace(config, isolate=bool(config.isolate))
    return operation_run.run_one(op, operation_run.Named(backend.name, backend.backend), case, config, spec_of(case))


def spec_of(case: Any) -> dict[str, object] | None:
    """The JSON of the spec `case` was drawn from, as its meta records it (None: it records none)."""
    meta = getattr(case, "meta", None)
    return meta.get("spec") if isinstance(meta, dict) else None


def _checked(backend: Loaded, case: Case, config: RunConfig) -> CaseResult:
    """`backend` on `case`: in a worker process when config.isolate asks for one, else in this process."""
    if not config.isolate:
        return run_one(backend, case, config)
    with executors_for([backend], config) as (executor,):
        return run_one(backend, case, config, executor)


def failure_message(result: CaseResult, replay: str) -> str:
    """The report's failure block for `result` (mask rows, first mismatch, verdict; an ERROR's whole
    traceback) and its replay line, control characters escaped (pytest prints the message as it is)."""
    return printable(f"{render_failures([result], whole_tracebacks=True)}\n    replay: {replay}")


def replay_command(backend: Loaded, case: Any, result: CaseResult, config: RunConfig,
                   repro_dir: Path | None) -> str:
    """`difftest replay <bundle>` when a repro dir is set (the bundle is written there), else the
    `difftest run` line that draws the same paged case; a hint for a case that no command line draws (one of
    another operation, or not drawn from a CaseSpec)."""
    if repro_dir is not None:
        folder = write_bundle(repro_dir, case, result, config, backend.origin, backend.contract.library)
        return bundle_replay_command(folder, backend.origin)
    line = case_command(backend_target(backend.origin, backend.name), case, config) if isinstance(case, Case) \
        else None
    what = "the case was not drawn from a CaseSpec" if isinstance(case, Case) else \
        f"difftest run --op {result.operation.value} draws no single case"
    return line or f"none from the command line ({what}): set a repro dir for a bundle"
