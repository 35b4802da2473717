"""Replay a reproducer bundle: its case through its backend, with the recorded device and overrides.

A bundle is data: replay imports a module named inside it only when the caller trusts the bundle;
otherwise the backend must be a registered one or be handed in by the caller.
"""

from __future__ import annotations

import dataclasses

from difftest.backends import Backend, Loaded, as_loaded, load_operation_backend, load_operation_registered
from difftest.core.errors import SpecError
from difftest.core.kinds import OperationKind
from difftest.engine.result import CaseResult
from difftest.engine.runner import executors_for
from difftest.records.bundle import Bundle
from difftest.records.commands import backend_target, case_command
from difftest.records.report import render_failures, render_table, summarize
from difftest.workflows.running import run_one


def bundle_backend(bundle: Bundle, trust: bool = False) -> Loaded:
    """The backend the bundle was recorded with, a backend of the bundle's operation: a registered name always
    (resolved among the registered names only: an origin that claims to be registered imports nothing else); a
    'pkg.mod:obj' origin (an indexer's 'LOGITS+TOPK' with such a half) only when `trust` (importing it runs
    that module's code)."""
    origin = bundle.origin
    if origin.target is not None and origin.registered:
        return load_operation_registered(bundle.operation, origin.target, "backend")
    if origin.target is not None and trust:
        return load_operation_backend(bundle.operation, origin.target, "backend")
    why = (f"the bundle names {origin.target}, which replay does not import unless trusted" if origin.target
           else f"the bundle's backend could not be rebuilt ({origin.why_not})")
    raise SpecError("backend", bundle.backend, f"a backend handed to replay, or trust: {why}")


def replay(bundle: Bundle, backend: Backend | None = None, trust: bool = False,
           isolate: bool | None = None) -> CaseResult:
    """The bundle's case through `backend` (else its recorded one, see bundle_backend), where the bundle's
    config runs it (or `isolate` says): in a worker process under isolation, so a recorded CRASH replays
    as a verdict; in this process otherwise (where a sanitizer watching this process sees the kernel)."""
    config = bundle.config
    if isolate is not None:
        config = dataclasses.replace(config, isolate=isolate, timeout=config.timeout if isolate else None)
    loaded = as_loaded(backend or bundle_backend(bundle, trust))
    with executors_for([loaded], config) as (executor,):
        return run_one(loaded, bundle.case, config, executor)


def render_replay(bundle: Bundle, result: CaseResult) -> str:
    """What `difftest replay` prints: the verdict against the recorded one, the row table, the failure
    (with the whole traceback of an ERROR), and the `difftest run` line that draws the bundle's case again
    with its recorded options (where the case was drawn from a spec)."""
    same = "the same as recorded" if result.verdict == bundle.verdict else "differs from the recorded one"
    lines = [f"replay {bundle.path}: {result.backend} on {result.case} [{result.description}] on {result.device}",
             f"verdict: {result.verdict.value} ({same}: {bundle.verdict.value})", "",
             render_table(summarize([result]))]
    failures = render_failures([result], whole_tracebacks=True)
    # The recorded backend's target: a --backends override is a name the user already has at hand.
    # A case of another operation is drawn again by `difftest run --op` from the spec its report keeps.
    drawn = case_command(backend_target(bundle.origin, bundle.backend), bundle.case, bundle.config) \
        if bundle.operation == OperationKind.PAGED_LOGITS else None
    return "\n".join([*lines, *(["", failures] if failures else []), *([f"repro: {drawn}"] if drawn else [])])
