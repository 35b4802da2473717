"""`check(backend, case)`: one backend on one case against the oracle, as a test assertion.

A PASS returns the CaseResult; a failure raises AssertionError whose message is the row table
(rows with the wrong -inf mask, the first mismatch, the verdict) and the one command line that
replays it; a backend that cannot take the case skips the calling test (pytest.skip) with the reason.
A test runner attaches an Observer (the pytest plugin does) to hear every result and to say where
failing cases leave a reproducer bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from difftest.backends import Backend, Loaded, as_loaded, get_backends
from difftest.core.case import Case
from difftest.core.text import printable
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.engine.runner import executors_for
from difftest.records.bundle import write_bundle
from difftest.records.commands import backend_target, case_command
from difftest.records.commands import replay_command as bundle_replay_command
from difftest.records.report import render_failures
from difftest.workflows.observe import Observer, current_observer
from difftest.workflows.running import run_one


def check(backend: Backend | str | Callable[..., object], case: Case,
          config: RunConfig | None = None) -> CaseResult:
    """Run `backend` on `case` and compare with the oracle, row by row.

    `backend` is a Backend, a registered name ("torch") or 'package.module:object', or a function
    decorated with difftest.backend(contract=...). `config` defaults to the case's device with the
    backend's declared encoding and layout. With `config.isolate` set (True, not by default: a worker
    started per call costs seconds) the backend runs in a worker process.
    Returns the CaseResult of a PASS; raises AssertionError (the row table, an error's traceback and the
    replay line) for any failure or error; skips the calling test (pytest.skip, with the reason) when
    the backend cannot take the case here.
    """
    __tracebackhide__ = True
    backend = _as_backend(backend)
    config = config or RunConfig(device=case.device.type)
    result = _checked(backend, case, config)
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


def _checked(backend: Loaded, case: Case, config: RunConfig) -> CaseResult:
    """`backend` on `case`: in a worker process when config.isolate asks for one, else in this process."""
    if not config.isolate:
        return run_one(backend, case, config)
    with executors_for([backend], config) as (executor,):
        return run_one(backend, case, config, executor)


def _as_backend(backend: Backend | str | Callable[..., object]) -> Loaded:
    if isinstance(backend, str):
        return get_backends([backend], "backend")[0]
    return as_loaded(backend, "backend")


def failure_message(result: CaseResult, replay: str) -> str:
    """The report's failure block for `result` (mask rows, first mismatch, verdict; an ERROR's whole
    traceback) and its replay line, control characters escaped (pytest prints the message as it is)."""
    return printable(f"{render_failures([result], whole_tracebacks=True)}\n    replay: {replay}")


def replay_command(backend: Loaded, case: Case, result: CaseResult, config: RunConfig,
                   repro_dir: Path | None) -> str:
    """`difftest replay <bundle>` when a repro dir is set (the bundle is written there), else the
    `difftest run` line that draws the same case; a hint when the case has no spec to draw it from."""
    if repro_dir is not None:
        folder = write_bundle(repro_dir, case, result, config, backend.origin, backend.contract.library)
        return bundle_replay_command(folder, backend.origin)
    line = case_command(backend_target(backend.origin, backend.name), case, config)
    return line or "none from the command line (the case was not drawn from a CaseSpec): set a repro dir for a bundle"
