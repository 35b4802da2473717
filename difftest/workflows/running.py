"""The engine's run with what a run adds above the engine, as steps each fresh result goes through: the
metamorphic relations (`RunConfig.metamorphic`, difftest.engine.metamorphic), checked where the backend runs,
then the compute-sanitizer replay of failing results (`RunConfig.sanitize`), which replays a bundle of the
case (difftest.records.bundle) under compute-sanitizer (difftest.engine.sanitize). Workflows and the
`difftest.run` facade call these."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from difftest.backends import Backend, Loaded
from difftest.core.case import Case
from difftest.core.errors import require
from difftest.core.kinds import MetamorphicRelation, OracleKind
from difftest.core.lifetime import scratch
from difftest.core.verdict import Verdict, worst
from difftest.engine import consensus, metamorphic, runner
from difftest.engine.batch import Batch
from difftest.engine.config import RunConfig
from difftest.engine.isolate import Executor
from difftest.engine.result import CaseResult
from difftest.engine.sanitize import SanitizerReport, replay_under
from difftest.records.bundle import write_bundle


def run(backends: list[Backend], cases: Iterable[Case | Batch], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None, done: runner.Done | None = None,
        takes: runner.Takes | None = None, on_done: Callable[[Case | Batch], None] | None = None) -> list[CaseResult]:
    """difftest.engine.runner.run, each fresh result through the run's steps (its relations, its sanitizer
    replay); without an oracle (config.oracle_kind NONE), difftest.engine.consensus.run, which takes no batches."""
    if config.oracle_kind == OracleKind.NONE:
        require(on_done is None, "on_done", on_done, "None: a consensus run hears each case's results, no item")
        return consensus.run(backends, cases, config, on_result, done, takes, amend=steps(config))  # type: ignore[arg-type]
    return runner.run(backends, cases, config, on_result, done, takes, on_done, amend=steps(config))


def run_one(backend: Backend, case: Case, config: RunConfig, executor: Executor | None = None) -> CaseResult:
    """difftest.engine.runner.run_one, the result through the run's steps (the relations, the sanitizer)."""
    return runner.run_one(backend, case, config, executor, amend=steps(config))


def steps(config: RunConfig) -> runner.Amend | None:
    """What each fresh result goes through: its metamorphic relations, then its compute-sanitizer replay,
    those the run asks for; None for neither."""
    chosen = [step for step in (metamorphic_step(config), sanitizer_step(config)) if step is not None]
    if not chosen:
        return None

    def amend(result: CaseResult, backend: Loaded, case: Case, executor: Executor) -> CaseResult:
        for step in chosen:
            result = step(result, backend, case, executor)
        return result
    return amend


def metamorphic_step(config: RunConfig) -> runner.Amend | None:
    """The step that checks the run's relations on a result that ran: a violated one is FAIL(metamorphic)
    (unless a worse verdict stands) and the violations go into the result."""
    if not config.metamorphic:
        return None
    require(all(isinstance(r, MetamorphicRelation) for r in config.metamorphic), "metamorphic",
            tuple(r.value for r in config.metamorphic),
            f"relations of the paged-logits operation: {[r.value for r in MetamorphicRelation]}")
    return lambda result, backend, case, executor: _related(result, backend, case, executor, config)


def _related(result: CaseResult, backend: Loaded, case: Case, executor: Executor, config: RunConfig) -> CaseResult:
    if result.verdict in (Verdict.SKIP, Verdict.ERROR, Verdict.CRASH, Verdict.TIMEOUT):
        return result  # no output to relate
    violations = metamorphic.check(backend, case, config.metamorphic, config, executor)
    if not violations:
        return result
    return dataclasses.replace(result, metamorphic=violations, verdict=worst([result.verdict,
                                                                              Verdict.FAIL_METAMORPHIC]))


def sanitizer_step(config: RunConfig) -> runner.Amend | None:
    """The step that attaches a result's compute-sanitizer replay, when the run asks for one."""
    if config.sanitize is None:
        return None
    return lambda result, backend, case, executor: _sanitized(result, backend, case, config)


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
