"""Replay a reproducer bundle, and write one for every failure of a run (`difftest run --repro-dir`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from difftest.backends import Backend, get_backends, load_backend
from difftest.bundle import Bundle, write_bundle
from difftest.case import Case
from difftest.runner import CaseResult, RunConfig, make_reference, run_backend


def bundle_backend(bundle: Bundle) -> Backend:
    """The backend a bundle was recorded with: its 'pkg.mod:obj' when recorded, else its registry name."""
    if bundle.backend_module:
        return load_backend(bundle.backend_module, "backend_module")
    return get_backends([bundle.backend])[0]


def run_case(backend: Backend, case: Case, config: RunConfig) -> CaseResult:
    """One backend on one case, on config.device, against a fresh oracle answer."""
    case = case.to(config.device)
    return run_backend(backend, case, make_reference(case), config)


def replay(bundle: Bundle, backend: Backend | None = None) -> CaseResult:
    """The bundle's case through its backend (or `backend`) with the recorded device and overrides."""
    return run_case(backend or bundle_backend(bundle), bundle.case, bundle.config)


def render_replay(bundle: Bundle, result: CaseResult) -> str:
    """What `difftest replay` prints: the verdict against the recorded one, the row table, the failure."""
    from difftest import report

    same = "the same as recorded" if result.verdict == bundle.verdict else "differs from the recorded one"
    lines = [f"replay {bundle.path}: {result.backend} on {result.case} [{result.description}] on {result.device}",
             f"verdict: {result.verdict.value} ({same}: {bundle.verdict.value})", "",
             report.render_table(report.summarize([result]))]
    failures = report.render_failures([result])
    return "\n".join([*lines, *(["", failures] if failures else [])])


class ReproWriter:
    """Writes a bundle for every failing result of a run.

    The runner hands `on_result` only the CaseResult, so `track` wraps the case stream and remembers
    the case being run: results of a case arrive before the runner draws the next one.
    """

    def __init__(self, directory: str | Path, config: RunConfig, backends: list[Backend],
                 modules: tuple[str, ...] = ()) -> None:
        self.directory, self.config = Path(directory), config
        # get_backends returns the module-path backends last, in the order given.
        loaded = backends[len(backends) - len(modules):] if modules else []
        self.modules = {b.name: m for b, m in zip(loaded, modules, strict=True)}
        self.libraries = {b.name: b.contract.library for b in backends}
        self.case: Case | None = None
        self.written: list[Path] = []

    def track(self, cases: Iterable[Case]) -> Iterator[Case]:
        """The same cases, each remembered while the runner works on it."""
        for case in cases:
            self.case = case
            yield case

    def on_result(self, result: CaseResult) -> None:
        """Write `result`'s bundle when it failed."""
        if result.verdict.failed and self.case is not None:
            self.written.append(write_bundle(self.directory, self.case, result, self.config,
                                             self.modules.get(result.backend), self.libraries.get(result.backend, "")))
