"""`check(backend, case)`: one backend on one case against the oracle, as a test assertion.

A PASS returns the CaseResult; a failure raises AssertionError whose message is the row table
(rows with the wrong -inf mask, the first mismatch, the verdict) and the one command line that
replays it; a backend that cannot take the case skips the calling test (pytest.skip) with the reason.
A test runner attaches an Observer (the pytest plugin does) to hear every result and to say where
failing cases leave a reproducer bundle.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

from difftest.backends import Backend, as_backend, available_names, load_backend
from difftest.backends.user import FunctionBackend
from difftest.case import Case
from difftest.errors import require
from difftest.replay import run_case
from difftest.runner import CaseResult, RunConfig
from difftest.verdict import Verdict


@dataclasses.dataclass(frozen=True)
class Observer:
    """What a test runner attaches to check(): who hears each result, where failures' bundles go."""

    on_result: Callable[[CaseResult], None] | None = None
    repro_dir: Path | None = None  # failing cases are written here (difftest.bundle) to be replayed


_OBSERVER: contextvars.ContextVar[Observer | None] = contextvars.ContextVar("difftest_check_observer",
                                                                           default=None)


@contextlib.contextmanager
def observed(observer: Observer) -> Iterator[None]:
    """Every check() inside the block reports to `observer`."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def check(backend: Backend | str | Callable[..., object], case: Case,
          config: RunConfig | None = None) -> CaseResult:
    """Run `backend` on `case` and compare with the oracle, row by row.

    `backend` is a Backend, a registered name ("torch") or 'package.module:object', or a function
    decorated with difftest.backend(contract=...). `config` defaults to the case's device with the
    backend's declared encoding and layout. Returns the CaseResult of a PASS; raises AssertionError
    (the row table and the replay line) for any failure or error; skips the calling test
    (pytest.skip, with the reason) when the backend cannot take the case here.
    """
    __tracebackhide__ = True
    backend = _as_backend(backend)
    config = config or RunConfig(device=case.device.type)
    result = run_case(backend, case, config)
    observer = _OBSERVER.get() or Observer()
    if observer.on_result is not None:
        observer.on_result(result)
    if result.verdict == Verdict.SKIP:
        import pytest

        pytest.skip(f"{backend.name} cannot take {case.name}: {result.reason}")
    if result.verdict.failed:
        raise AssertionError(failure_message(result, replay_command(backend, case, result, config,
                                                                    observer.repro_dir)))
    return result


def _as_backend(backend: Backend | str | Callable[..., object]) -> Backend:
    if not isinstance(backend, str):
        return as_backend(backend, "backend", repr(backend))
    known = available_names()
    if backend in known:
        return load_backend(known[backend], f"backend {backend!r}")
    require(":" in backend, "backend", backend, f"a registered name among {sorted(known)} or 'package.module:object'")
    return load_backend(backend, "backend")


def failure_message(result: CaseResult, replay: str) -> str:
    """The report's failure block for `result` (mask rows, first mismatch, verdict) and its replay line."""
    from difftest.report import render_failures

    return f"{render_failures([result])}\n    replay: {replay}"


def replay_command(backend: Backend, case: Case, result: CaseResult, config: RunConfig,
                   repro_dir: Path | None) -> str:
    """`difftest replay <bundle>` when a repro dir is set (the bundle is written there), else the
    `difftest run` line that draws the same case; a hint when the case has no spec to draw it from."""
    module = backend_module(backend)
    if repro_dir is not None:
        from difftest.bundle import write_bundle

        folder = write_bundle(repro_dir, case, result, config, backend_module=module,
                              library=backend.contract.library)
        return f"difftest replay {shlex.quote(str(folder))}"
    spec, seed = case.meta.get("spec"), case.meta.get("seed")
    if spec is None or seed is None:
        return "none from the command line (the case was not drawn from a CaseSpec): set a repro dir for a bundle"
    words = ["difftest", "run", *(["--backend-module", module] if module else ["--backends", backend.name]),
             "--spec", json.dumps(_changed_fields(spec), separators=(",", ":")), "--seed", str(seed)]
    if config.device != "cpu":
        words += ["--device", config.device]
    if config.encoding is not None:
        words += ["--encoding", config.encoding.value]
    if config.layout is not None:
        words += ["--layout", config.layout.value]
    return shlex.join(words)


def backend_module(backend: Backend) -> str | None:
    """'package.module:object' that loads `backend` again; None for a registered backend."""
    if backend.name in available_names():
        return None
    source = backend.fn if isinstance(backend, FunctionBackend) else type(backend)
    return f"{source.__module__}:{source.__qualname__}"


def _changed_fields(spec: dict[str, object]) -> dict[str, object]:
    """The spec's name and the fields that differ from CaseSpec's defaults (CaseSpec.from_json fills the rest)."""
    from generators.spec import CaseSpec

    defaults = CaseSpec().to_json()
    return {k: v for k, v in spec.items() if k == "name" or defaults.get(k) != v}
