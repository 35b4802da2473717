"""Which backends and cases this run tests, for the operation of --difftest-op: resolved from the Settings on
first use, each backend loaded once."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from difftest.core.kinds import CaseKind, OperationKind
from difftest_pytest.options import BACKENDS, Settings, usage_error

if TYPE_CHECKING:
    from difftest.backends import Loaded
    from difftest.core.operation import Operation


@dataclasses.dataclass(frozen=True)
class Drawable:
    """One case the run draws: the operation's spec and the seed, and the backends whose envelope plan chose it
    (None: every selected backend runs it)."""

    spec: Any
    seed: int
    backends: frozenset[str] | None = None

    def for_backend(self, backend_id: str) -> bool:
        """Whether backend `backend_id` runs this case."""
        return self.backends is None or backend_id in self.backends


class Selection:
    """The selected backends (by id: the registered name, or the name a module path's backend declares)
    and the seeded cases of the run, all of the operation --difftest-op names."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._targets: dict[str, str] | None = None
        self._loaded: dict[str, Loaded] = {}

    @property
    def op(self) -> Operation:
        """The operation the run tests (difftest.operations)."""
        from difftest.operations import operation  # deferred: loads torch

        return operation(self.settings.op)

    def targets(self) -> dict[str, str]:
        """backend id -> what loads it (a registered name or 'module:object'); every registered backend
        of the operation unless some are named."""
        if self._targets is None:
            self._targets = self._resolve()
        return self._targets

    def _resolve(self) -> dict[str, str]:
        from difftest.backends.registry import load_operation_backend  # deferred: loads torch
        from difftest.core.errors import SpecError

        if self.settings.backends is None:
            return {name: name for name in self._registered()}
        targets = {}
        for token in self.settings.backends:
            try:
                backend = load_operation_backend(self.settings.op, token, BACKENDS)
            except SpecError as exc:
                raise usage_error(BACKENDS, token, exc.expected) from None
            targets[backend.name] = token
            self._loaded[backend.name] = backend
        return targets

    def _registered(self) -> list[str]:
        """Every registered backend name of the operation (the paged ones' entry points included)."""
        from difftest.backends import available_names  # deferred: loads torch

        return list(available_names()) if self.settings.op == OperationKind.PAGED_LOGITS else list(self.op.backends())

    def backend_ids(self, only: Sequence[str] | None = None) -> list[str]:
        """The selected ids, restricted to `only` (a difftest marker's backends) when given."""
        if only is None:
            return list(self.targets())
        registered = self._registered()
        unknown = [name for name in only if name not in self.targets() and name not in registered]
        if unknown:
            pytest.fail(f"difftest marker: backends={list(only)!r}: {unknown} are not registered "
                        f"(registered: {sorted(registered)})", pytrace=False)
        return [backend_id for backend_id in self.targets() if backend_id in only]

    def loaded(self, backend_id: str) -> Loaded:
        """The backend, loaded once (a backend that does not load fails the calling test, saying why)."""
        if backend_id not in self._loaded:
            from difftest.backends.registry import load_operation_backend  # deferred: loads torch
            from difftest.core.errors import SpecError

            try:
                self._loaded[backend_id] = load_operation_backend(self.settings.op, self.targets()[backend_id],
                                                                  f"backend {backend_id!r}")
            except SpecError as exc:
                pytest.fail(f"backend {backend_id!r} does not load: {exc}", pytrace=False)
        return self._loaded[backend_id]

    def backend(self, backend_id: str) -> Loaded:
        """The backend, loaded once; the calling test skips with its unavailable_reason on this device."""
        backend = self.loaded(backend_id)
        reason = backend.unavailable_reason(self.settings.device)
        if reason:
            pytest.skip(reason)
        return backend

    def cases(self, next_n: tuple[int, ...] | None = None) -> list[Drawable]:
        """Every selected case: each selected backend's envelope plan (`envelope`, a spec two plans share drawn
        once), else the fixed suite (paged logits': difftest.engine.plan, whose `next_n` makes one copy of each
        spec per value; another operation's: Operation.suite, one seed for 'edges', COUNT otherwise)."""
        kind = CaseKind(self.settings.cases)
        if next_n is not None and (kind == CaseKind.ENVELOPE or self.settings.op != OperationKind.PAGED_LOGITS):
            pytest.fail(f"difftest marker: next_n={list(next_n)!r}: copies the fixed paged-logits cases only (not "
                        f"{self.settings.op.value} {kind.value} cases)", pytrace=False)
        if kind == CaseKind.ENVELOPE:
            return self._envelope_cases()
        seeds = range(self.settings.seed, self.settings.seed + self.settings.count)
        if self.settings.op != OperationKind.PAGED_LOGITS:
            count = 1 if kind == CaseKind.EDGES else self.settings.count
            return [Drawable(spec, seed) for spec in self.op.suite() for seed in seeds[:count]]
        from difftest.engine.plan import SuiteRequest, plan  # deferred: loads pydantic and numpy (the spec schema)

        request = SuiteRequest(cases=kind, count=self.settings.count, seed=self.settings.seed, next_n=next_n)
        return [Drawable(planned.spec, planned.seed) for planned in plan(request)]

    def _envelope_cases(self) -> list[Drawable]:
        """Each available backend's envelope plan on the device (Operation.envelope of its contract), COUNT seeds
        per spec; a backend that cannot run here plans nothing (its items would only skip)."""
        takers: dict[Any, list[str]] = {}
        for backend_id in self.targets():
            backend = self.loaded(backend_id)
            if backend.unavailable_reason(self.settings.device) is None:
                for planned in self.op.envelope(backend.contract, self.settings.device):
                    takers.setdefault(planned.spec, []).append(backend_id)
        seeds = range(self.settings.seed, self.settings.seed + self.settings.count)
        return [Drawable(spec, seed, frozenset(ids)) for spec, ids in takers.items() for seed in seeds]

    def build(self, drawable: Drawable) -> Any:
        """The case, drawn on the selected device by its operation's builder."""
        return self.op.build(drawable.spec, drawable.seed, self.settings.device)


def case_ids(cases: Sequence[Drawable]) -> list[str]:
    """The test id of each case: its spec's name, and where several cases share one name (several seeds of a
    spec, or two envelope specs of one family), their place among them ('random-mtp1-uniform-0'). Never the
    seed itself: it changes from run to run, and `--lf`, `-k` and CI retries must find the same test again
    (the seed is in the header and the summary)."""
    total, seen = Counter(c.spec.name for c in cases), Counter[str]()
    ids = []
    for planned in cases:
        name = planned.spec.name
        ids.append(name if total[name] == 1 else f"{name}-{seen[name]}")
        seen[name] += 1
    return ids


def per_backend(backend_ids: Sequence[str], cases: Sequence[Drawable]) -> list[tuple[str, Drawable, str]]:
    """(backend id, case, case id) of every case each backend runs, backend-major; the ids numbered among that
    backend's own cases (case_ids), so two envelope plans that each name a spec 'random-k512' number neither."""
    pairs = []
    for backend_id in backend_ids:
        mine = [case for case in cases if case.for_backend(backend_id)]
        pairs += [(backend_id, case, case_id) for case, case_id in zip(mine, case_ids(mine), strict=True)]
    return pairs
