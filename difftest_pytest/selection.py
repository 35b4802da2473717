"""Which backends and cases this run tests: resolved from the Settings on first use, loaded once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from difftest.core.kinds import CaseKind, OperationKind
from difftest_pytest.options import BACKENDS, Settings, usage_error

if TYPE_CHECKING:
    from difftest.backends import Backend
    from difftest.core.case import Case
    from difftest.engine.plan import PlannedCase


class Selection:
    """The selected backends (by id: the registered name, or the name a module path's backend declares)
    and the seeded cases of the run."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._targets: dict[str, str] | None = None
        self._loaded: dict[str, Backend] = {}

    def targets(self) -> dict[str, str]:
        """backend id -> what loads it (a registered name or 'module:object'); every registered backend
        unless some are named."""
        if self._targets is None:
            self._targets = self._resolve()
        return self._targets

    def _resolve(self) -> dict[str, str]:
        from difftest.backends import available_names, load_backend  # deferred: loads torch
        from difftest.core.errors import SpecError

        if self.settings.op != OperationKind.PAGED_LOGITS:
            return self._resolve_operation()
        known = available_names()
        if self.settings.backends is None:
            return {name: name for name in known}
        targets = {}
        for token in self.settings.backends:
            try:
                backend = load_backend(token, BACKENDS)
            except SpecError as exc:
                raise usage_error(BACKENDS, token, exc.expected) from None
            targets[backend.name] = token
            self._loaded[backend.name] = backend
        return targets

    def _resolve_operation(self) -> dict[str, str]:
        """The names of the operation's backends chosen (every one unless some are named)."""
        from difftest.operations import operation  # deferred: loads torch

        table = operation(self.settings.op).backends()
        unknown = [name for name in self.settings.backends or () if name not in table]
        if unknown:
            raise usage_error(BACKENDS, ",".join(unknown), f"backends of the {self.settings.op.value} operation: "
                                                          f"{', '.join(table)}")
        return {name: name for name in self.settings.backends or table}

    def operation_cases(self) -> list[tuple[str, Any, int]]:
        """(test id, spec, seed) of every case of the operation's fixed suite: one seed for 'edges', COUNT
        seeds otherwise; the id is the spec's name (and the seed's place among a spec's seeds)."""
        from difftest.operations import operation  # deferred: loads torch

        count = 1 if self.settings.cases == CaseKind.EDGES.value else self.settings.count
        specs = operation(self.settings.op).suite()
        total = Counter(spec.name for spec in specs)
        cases, seen = [], Counter[str]()
        for spec in specs:
            for seed in range(self.settings.seed, self.settings.seed + count):
                many = total[spec.name] * count > 1
                cases.append((f"{spec.name}-{seen[spec.name]}" if many else spec.name, spec, seed))
                seen[spec.name] += 1
        return cases

    def backend_ids(self, only: Sequence[str] | None = None) -> list[str]:
        """The selected ids, restricted to `only` (a difftest marker's backends) when given."""
        if only is None:
            return list(self.targets())
        from difftest.backends import available_names  # deferred: loads torch

        unknown = [name for name in only if name not in self.targets() and name not in available_names()]
        if unknown:
            pytest.fail(f"difftest marker: backends={list(only)!r}: {unknown} are not registered "
                        f"(registered: {sorted(available_names())})", pytrace=False)
        return [backend_id for backend_id in self.targets() if backend_id in only]

    def backend(self, backend_id: str) -> Backend:
        """The backend, loaded once; the calling test skips with its unavailable_reason on this device."""
        if backend_id not in self._loaded:
            from difftest.backends import load_backend  # deferred: loads torch
            from difftest.core.errors import SpecError

            try:
                self._loaded[backend_id] = load_backend(self.targets()[backend_id], f"backend {backend_id!r}")
            except SpecError as exc:
                pytest.fail(f"backend {backend_id!r} does not load: {exc}", pytrace=False)
        backend = self._loaded[backend_id]
        reason = backend.unavailable_reason(self.settings.device)
        if reason:
            pytest.skip(reason)
        return backend

    def cases(self, next_n: tuple[int, ...] | None = None) -> list[PlannedCase]:
        """Every selected case (difftest.engine.plan); `next_n` makes one copy of each spec per value."""
        from difftest.engine.plan import SuiteRequest, plan  # deferred: loads pydantic and numpy (the spec schema)

        request = SuiteRequest(cases=CaseKind(self.settings.cases), count=self.settings.count,
                               seed=self.settings.seed, next_n=next_n)
        return plan(request)

    def build(self, planned: PlannedCase) -> Case:
        """The planned case, drawn on the selected device."""
        from difftest.generators.tensors import build_case  # deferred: loads torch

        return build_case(planned.spec, planned.seed, self.settings.device, name=planned.name)


def case_ids(cases: Sequence[PlannedCase]) -> list[str]:
    """The test id of each case: its spec's name, and where several seeds draw one spec, the seed's place
    among them ('random-mtp1-uniform-0'). Never the seed itself: it changes from run to run, and `--lf`,
    `-k` and CI retries must find the same test again (the seed is in the header and the summary)."""
    total, seen = Counter(c.spec.name for c in cases), Counter[str]()
    ids = []
    for planned in cases:
        name = planned.spec.name
        ids.append(name if total[name] == 1 else f"{name}-{seen[name]}")
        seen[name] += 1
    return ids
