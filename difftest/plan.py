"""Planning: which (spec, seed) cases a run draws, what they are called, which of them one shard
runs, and which results of an earlier run still belong to it.

Shared by `difftest run`, the pytest plugin and the spread runner, so a case has one name and one
place in the plan wherever it is run. Errors name these functions' parameters. Planning imports no
torch: the pytest plugin plans at collection time.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from difftest.errors import SpecError, require
from difftest.kinds import CaseKind
from generators.cases import suite
from generators.spec import CaseSpec, case_name

if TYPE_CHECKING:
    from difftest.result import CaseResult

T = TypeVar("T")
MAX_SEED = 2**62  # seeds grow by 1000 per spec; torch takes any int64
MAX_COUNT = 100_000  # seeds per spec: more is a typo, not a campaign (a budgeted fuzz run is the tool for that)
SHARD_FORM = "I/N with 0 <= I < N, e.g. 0/2"


@dataclasses.dataclass(frozen=True)
class PlannedCase:
    """One case of a plan: the spec and seed it is drawn from."""

    spec: CaseSpec
    seed: int

    @property
    def name(self) -> str:
        """The case's name in results, filters and resumed runs."""
        return case_name(self.spec, self.seed)


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the planned cases whose position in the plan is index mod count."""

    index: int
    count: int

    def __post_init__(self) -> None:
        require(0 <= self.index < self.count, "shard", f"{self.index}/{self.count}", SHARD_FORM)

    @classmethod
    def parse(cls, text: str) -> Shard:
        """The shard of 'I/N'; SpecError naming `shard` unless 0 <= I < N."""
        index, _, count = text.partition("/")
        try:
            return cls(int(index), int(count))
        except ValueError:
            raise SpecError("shard", text, SHARD_FORM) from None

    def of(self, plan: Sequence[T]) -> list[T]:
        """This shard's items of `plan`, in their order."""
        return list(plan[self.index::self.count])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclasses.dataclass(frozen=True)
class SuiteRequest:
    """What to plan: a named suite (with overrides) or one spec, then filters and a shard."""

    cases: CaseKind = CaseKind.ALL
    count: int | None = None  # seeds per random spec; default 6 for a suite, 1 for a spec
    seed: int = 0
    next_n: tuple[int, ...] | None = None  # one copy of every spec per value
    block_sizes: tuple[int, ...] | None = None
    batch: int | None = None
    max_model_len: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    spec: CaseSpec | None = None  # one spec instead of the suite
    case_filter: tuple[str, ...] = ()  # fnmatch patterns on case names
    shard: Shard | None = None

    def __post_init__(self) -> None:
        require(self.count is None or 0 <= self.count <= MAX_COUNT, "count", self.count,
                f"an integer in [0, {MAX_COUNT}]")
        require(-MAX_SEED <= self.seed < MAX_SEED, "seed", self.seed, "an integer in [-2**62, 2**62)")

    @property
    def overrides(self) -> dict[str, int]:
        """The spec fields every random spec takes instead of its own."""
        given = dict(batch=self.batch, max_model_len=self.max_model_len, heads=self.heads, head_dim=self.head_dim)
        return {k: v for k, v in given.items() if v is not None}


def plan(request: SuiteRequest) -> list[PlannedCase]:
    """The cases `request` names, narrowed by its filters, then to its shard."""
    # Checked even where they apply to no spec (an edges-only suite): a bad value is never silently ignored.
    CaseSpec().replace(**request.overrides).validate()
    cases = _spec_cases(request) if request.spec else _suite_cases(request)
    cases = filtered(cases, request.case_filter) if request.case_filter else cases
    return request.shard.of(cases) if request.shard else cases


def _suite_cases(request: SuiteRequest) -> list[PlannedCase]:
    pairs = suite(request.cases.value, 6 if request.count is None else request.count, request.seed,
                  request.next_n, request.block_sizes, **request.overrides)
    return [PlannedCase(spec, seed) for spec, seed in pairs]


def _spec_cases(request: SuiteRequest) -> list[PlannedCase]:
    """The one spec at `seed`, and the next seeds up to `count`."""
    assert request.spec is not None
    return [PlannedCase(request.spec.validate(), request.seed + i) for i in range(request.count or 1)]


def filtered(cases: list[PlannedCase], globs: Iterable[str]) -> list[PlannedCase]:
    """The cases whose name matches one of `globs`; every glob must match some case (else it is a typo)."""
    names = [c.name for c in cases]
    for glob in globs:
        require(any(fnmatch.fnmatchcase(name, glob) for name in names), "case_filter", glob,
                f"a pattern matching some of the {len(names)} case names, e.g. {names[:3]}")
    return [c for c in cases if any(fnmatch.fnmatchcase(c.name, glob) for glob in globs)]


def kept_results(results: Iterable[CaseResult], cases: Sequence[PlannedCase], backends: Iterable[str],
                 device: str, source: str) -> dict[tuple[str, str], CaseResult]:
    """The results of an earlier run (read from `source`) that belong to this one, by (backend, case).

    A result belongs when its backend and case are in the run. It must have been made from the same
    spec on the same device, or the merged report would mix two different runs: SpecError naming
    `resume` then.
    """
    specs = {c.name: c.spec.to_json() for c in cases}
    names = set(backends)
    kept = {}
    for result in results:
        if result.backend not in names or result.case not in specs:
            continue
        require(result.spec == specs[result.case] and result.device == device, "resume", source,
                f"results of this run's cases: {result.case} there was made from another spec or device "
                f"({result.device}); run with the same options")
        kept[(result.backend, result.case)] = result
    return kept
