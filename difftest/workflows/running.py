"""The engine's run with what a run adds above the engine: the compute-sanitizer replay of failing
results (`RunConfig.sanitize`), which replays a bundle of the case (difftest.records.bundle) under
compute-sanitizer (difftest.engine.sanitize). Workflows and the `difftest.run` facade call these."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from difftest.backends import Backend, Loaded
from difftest.core.case import Case
from difftest.core.lifetime import scratch
from difftest.core.verdict import Verdict, worst
from difftest.engine import runner
from difftest.engine.batch import Batch
from difftest.engine.config import RunConfig
from difftest.engine.isolate import Executor
from difftest.engine.result import CaseResult
from difftest.engine.sanitize import SanitizerReport, replay_under
from difftest.records.bundle import write_bundle


def run(backends: list[Backend], cases: Iterable[Case | Batch], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None, done: runner.Done | None = None,
        takes: runner.Takes | None = None, on_done: Callable[[Case | Batch], None] | None = None) -> list[CaseResult]:
    """difftest.engine.runner.run, each failing result replayed under config.sanitize when it is set."""
    return runner.run(backends, cases, config, on_result, done, takes, on_done, amend=sanitizer_step(config))


def run_one(backend: Backend, case: Case, config: RunConfig, executor: Executor | None = None) -> CaseResult:
    """difftest.engine.runner.run_one, the result replayed under config.sanitize when it fails and that is set."""
    return runner.run_one(backend, case, config, executor, amend=sanitizer_step(config))


def sanitizer_step(config: RunConfig) -> runner.Amend | None:
    """The step that attaches a result's compute-sanitizer replay, when the run asks for one."""
    if config.sanitize is None:
        return None
    return lambda result, backend, case: _sanitized(result, backend, case, config)


def _sanitized(result: CaseResult, backend: Loaded, case: Case, config: RunConfig) -> CaseResult:
    """`result` with its compute-sanitizer replay attached, when it failed (or the run replays every result)."""
    if result.verdict == Verdict.SKIP or not (result.verdict.failed or config.sanitize_all):
        return result
    report = _sanitizer_report(result, backend, case, config)
    verdict = worst([result.verdict, Verdict.FAIL_SANITIZER]) if report.errors else result.verdict
    return dataclasses.replace(result, sanitizer=report, verdict=verdict)


def _sanitizer_report(result: CaseResult, backend: Loaded, case: Case, config: RunConfig) -> SanitizerReport:
    assert config.sanitize is not None
    if result.verdict == Verdict.TIMEOUT:
        return SanitizerReport(config.sanitize, ran=False,
                               reason="the call timed out; under the sanitizer it would run longer still")
    if backend.origin.target is None:
        return SanitizerReport(config.sanitize, ran=False, reason="the backend cannot be rebuilt in a fresh "
                               f"process: {backend.origin.why_not}")
    with scratch("difftest-sanitize-") as folder:
        bundle = write_bundle(folder, case, result, config, backend.origin, backend.contract.library)
        return replay_under(config.sanitize, Path(bundle), config.device)
