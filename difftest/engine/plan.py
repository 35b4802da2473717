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

from difftest.core.errors import SpecError, require
from difftest.core.kinds import CaseKind
from difftest.core.spec import CaseSpec, case_name
from difftest.generators.cases import suite

if TYPE_CHECKING:
    from difftest.backends import Backend
    from difftest.core.case import Case
    from difftest.core.contract import Contract
    from difftest.engine.result import CaseResult
    from difftest.generators.envelope import Target

T = TypeVar("T")
MAX_SEED = 2**62  # seeds grow by 1000 per spec; torch takes any int64
MAX_COUNT = 100_000  # seeds per spec: more is a typo, not a campaign (a budgeted fuzz run is the tool for that)
SHARD_FORM = "I/N with 0 <= I < N, e.g. 0/2"


@dataclasses.dataclass(frozen=True)
class PlannedCase:
    """One case of a plan: the spec and seed it is drawn from, the edge families it reaches, the backends
    that run it (None: every backend of the run) and, per backend, the families it reaches for that
    backend's own envelope (a backend running a case another one called for reaches only what its own
    plan claims of it: a 1024-token case is the longest context of one envelope, not of every one)."""

    spec: CaseSpec
    seed: int
    families: tuple[str, ...] = ()
    backends: frozenset[str] | None = None
    reach: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (backend, its families), for an envelope plan

    @property
    def name(self) -> str:
        """The case's name in results, filters and resumed runs."""
        return case_name(self.spec, self.seed)

    def build(self, device: str, validate: bool = True) -> Case:
        """The case drawn on `device`, its meta naming the families it reaches."""
        (case,) = build_together([self], device)
        return case.validate() if validate else case


def build_together(planned: Sequence[PlannedCase], device: str) -> list[Case]:
    """The planned cases drawn together, not validated: bit for bit what each one's build gives, with one
    host read of all their lengths (difftest.generators.tensors.build_cases). They must share the
    fields of a batch (heads, head_dim, block_size, next_n, fp8)."""
    from difftest.generators.tensors import build_cases  # deferred: the pytest plugin plans without torch

    cases = build_cases([(p.spec, p.seed) for p in planned], device, [p.name for p in planned])
    return [case.lengths_to(dataclasses.replace(case, meta={**case.meta, **_families_meta(p)}))
            for case, p in zip(cases, planned, strict=True)]


def _families_meta(planned: PlannedCase) -> dict[str, object]:
    """The case meta naming its families, and each backend's when the plan says (difftest.engine.runner
    reports a backend's own)."""
    meta: dict[str, object] = {"families": list(planned.families)}
    if planned.reach:
        meta["reach"] = {name: list(families) for name, families in planned.reach}
    return meta


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

    cases: CaseKind = CaseKind.ENVELOPE
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
        require(self.count is None or 1 <= self.count <= MAX_COUNT, "count", self.count,
                f"an integer in [1, {MAX_COUNT}] (cases edges runs the edge cases alone)")
        require(-MAX_SEED <= self.seed < MAX_SEED, "seed", self.seed, "an integer in [-2**62, 2**62)")

    @property
    def overrides(self) -> dict[str, int]:
        """The spec fields every random spec takes instead of its own."""
        given = dict(batch=self.batch, max_model_len=self.max_model_len, heads=self.heads, head_dim=self.head_dim)
        return {k: v for k, v in given.items() if v is not None}


def plan(request: SuiteRequest) -> list[PlannedCase]:
    """The cases `request` names, narrowed by its filters, then to its shard. Envelope suites depend on
    the backends and the device: envelope_plan makes those."""
    require(request.spec is not None or request.cases != CaseKind.ENVELOPE, "cases", request.cases.value,
            "random, edges or all here (an envelope suite is planned from its backends by envelope_plan)")
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
    kept = matching([c.name for c in cases], tuple(globs))
    return [c for c in cases if c.name in kept]


def matching(names: Sequence[str], globs: Sequence[str]) -> set[str]:
    """The names that match one of `globs` (fnmatch); SpecError naming `case_filter` for a glob that matches none
    (a typo). Every operation's plan is filtered by it (difftest.workflows.operation_session)."""
    for glob in globs:
        require(any(fnmatch.fnmatchcase(name, glob) for name in names), "case_filter", glob,
                f"a pattern matching some of the {len(names)} case names, e.g. {list(names[:3])}")
    return {name for name in names if any(fnmatch.fnmatchcase(name, glob) for glob in globs)}


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


@dataclasses.dataclass(frozen=True)
class EnvelopePlan:
    """Cases drawn inside every backend's declared envelope, and what each backend does not reach."""

    cases: list[PlannedCase]
    omitted: dict[str, list[tuple[str, str]]]  # backend -> (edge family, why it was left out)
    idle: dict[str, str]  # backend -> why it runs no case here at all

    def narrowed(self, request: SuiteRequest) -> list[PlannedCase]:
        """The cases `request`'s filters and shard keep."""
        cases = filtered(self.cases, request.case_filter) if request.case_filter else self.cases
        return request.shard.of(cases) if request.shard else cases


def envelope_plan(backends: Sequence[Backend], target: Target, seed: int, count: int = 1) -> EnvelopePlan:
    """Cases for every backend inside its own envelope at `target`'s scale (difftest.generators.envelope), one
    case per distinct spec so backends whose envelopes agree share the oracle's answer; each case runs
    on every backend whose contract takes it. Specs of the RANDOM family get `count` seeds."""
    from difftest.generators.envelope import EdgeFamily, envelope_specs  # deferred: envelopes import torch (contracts)

    idle = {b.name: reason for b in backends if (reason := _idle_reason(b, target))}
    specs: dict[CaseSpec, dict[str, tuple[str, ...]]] = {}  # spec -> backend -> the families its plan claims
    omitted: dict[str, list[tuple[str, str]]] = {}
    for backend in (b for b in backends if b.name not in idle):
        planned, left_out = envelope_specs(backend.contract, target)
        for item in planned:
            specs.setdefault(item.spec, {})[backend.name] = tuple(f.value for f in item.families)
        omitted[backend.name] = [(o.family.value, o.reason) for o in left_out]
    working = [b for b in backends if b.name not in idle]
    cases = []
    for index, (spec, claims) in enumerate(_uniquely_named(specs)):
        takers = frozenset(b.name for b in working if _takes(b.contract, spec, target))
        families = tuple(sorted({f for claimed in claims.values() for f in claimed}))
        reach = tuple((name, tuple(sorted(claims.get(name, ())))) for name in sorted(takers))
        seeds = count if EdgeFamily.RANDOM.value in families else 1
        cases += [PlannedCase(spec, seed + 1000 * index + k, families, takers, reach) for k in range(seeds)]
    return EnvelopePlan(cases, omitted, idle)


def _idle_reason(backend: Backend, target: Target) -> str | None:
    try:
        return backend.unavailable_reason(target.device.value)
    except (Exception, SystemExit):  # a backend's own check failing is its fault: planned by its
        return None  # contract, so that the runner, asking again per case, gives it ERROR (not silence)


def _uniquely_named(specs: dict[CaseSpec, T]) -> list[tuple[CaseSpec, T]]:
    """The specs, a repeated name given a -2, -3, ... suffix so every case name stays unique."""
    seen: dict[str, int] = {}
    named = []
    for spec, families in specs.items():
        seen[spec.name] = seen.get(spec.name, 0) + 1
        unique = spec if seen[spec.name] == 1 else spec.replace(name=f"{spec.name}-{seen[spec.name]}")
        named.append((unique, families))
    return named


def _takes(contract: Contract, spec: CaseSpec, target: Target) -> bool:
    """Whether a backend with `contract` can be handed cases of `spec` on `target`: its envelope takes
    the spec, and running it there fits the target's memory. A spec another backend's envelope called
    for may not: AITER's stage1 holds H times the logits (Contract.working_memory) where the fused
    kernels hold the logits alone."""
    from difftest.generators.envelope import estimate_bytes  # deferred: envelopes import torch (contracts)

    if contract.shape_reason(spec.next_n, spec.heads, spec.head_dim, spec.block_size) is not None:
        return False
    footprint = estimate_bytes(spec, contract)
    if contract.limits_reason(spec.max_model_len, footprint.pool_bytes, spec.total_batch, spec.next_n) is not None:
        return False
    return footprint.total(target.device) <= target.memory_bytes
