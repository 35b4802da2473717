"""The top-k and ragged-logits parts of `difftest selftest`: each operation's mutants (the catalogue's entries of
that operation, difftest.backends.mutants) on that operation's envelope plan for their contract at the run's
scale, in this process: the paged runner takes paged cases only.

What differs between the operations is data (MutantRun): the plan that lists the edge families and says why it
leaves any out, and the catalogue's factory of the mutant. Each case is built, called and judged by the
operation's own pieces (difftest.operations: the tie-aware top-k oracle, the ragged comparison), one launch at a
time through the operation runner (difftest.engine.operation_run.run_one: a mutant that raises is an ERROR, one
that runs out of memory a SKIP), the oracle's answer made once per case.

With a template (a user's top-k or ragged backend: `difftest selftest --backend-template`) the operation's
mutants take its envelope, as the paged mutants take a paged template's: the shapes it accepts and, for ragged
logits, its mask and tolerance; each mutant keeps the conventions its code implements (the top-k index, padding,
window form and NaN ranking; the ragged output form and fp8 flavour), so the plan is the template's envelope
seen through them.

As for the paged mutants, one that must pass runs every case, and another stops once a case of the family it
names has failed (at its first failure where that family has no case here). Each case runs `repeat` launches,
each judged: a choice among ties, or a head sum, that moves from launch to launch must be right every time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from difftest.backends import mutants as catalogue
from difftest.core.kinds import OperationKind
from difftest.core.operation import Operation
from difftest.core.ragged import RaggedContract
from difftest.core.topk import TopkContract
from difftest.core.verdict import Verdict, worst
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Named, References, run_one, run_operation
from difftest.engine.result import CaseResult
from difftest.engine.runner import NotDrawn
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, ragged_plan
from difftest.generators.topk import TopkPlanned, topk_plan
from difftest.operations import operation
from difftest.workflows.operation_session import drawn_or_not

Progress = Callable[[str], None]  # hears one line as each mutant first fails
Heard = list[tuple[CaseResult, tuple[str, ...]]]  # results with the families of their cases


@dataclasses.dataclass(frozen=True)
class MutantRun:
    """One operation's part of the selftest: its plan and how the catalogue makes its mutants."""

    kind: OperationKind  # its cases built, called and judged by difftest.operations.operation(kind)
    plan: Callable[[Any, Target], list[Any]]  # (contract, target) -> planned cases and omissions
    planned: type  # the plan's planned case (.spec, .families); its other items are omissions (.family, .reason)
    mutant: Callable[[str], Any]  # catalogue key -> the mutant backend
    envelope: Callable[[Any, Any], Any]  # (a mutant's contract, a template's) -> the mutant's in that envelope

    @property
    def operation(self) -> Operation:
        """The operation its cases are built, called and judged by."""
        return operation(self.kind)


def topk_envelope(own: TopkContract, template: TopkContract) -> TopkContract:
    """A top-k mutant's conventions (`own`: index, padding, window form, order, NaN ranking) in the envelope of
    `template`: the k values, widths, rows, next_n, row strides and dtypes it takes."""
    return dataclasses.replace(own, ks=template.ks, max_k=template.max_k, max_width=template.max_width,
                               max_rows=template.max_rows, width_at_least_k=template.width_at_least_k,
                               next_n=template.next_n, row_stride=template.row_stride, dtypes=template.dtypes,
                               library=_in_envelope(own.library, template.library))


def ragged_envelope(own: RaggedContract, template: RaggedContract) -> RaggedContract:
    """A ragged mutant's conventions (`own`: output form, fp8 flavour, tiling) in the envelope of `template`: the
    heads, head dims, rows and keys it takes, and the mask and tolerance it is judged by."""
    return dataclasses.replace(own, mask=template.mask, rtol=template.rtol, heads=template.heads,
                               head_dims=template.head_dims, powers_of_two=template.powers_of_two,
                               max_rows=template.max_rows, max_keys=template.max_keys,
                               library=_in_envelope(own.library, template.library))


def _in_envelope(own: str, template: str) -> str:
    return f"{own}, in the envelope of {template or 'the template'}"


RUNS = {OperationKind.TOPK: MutantRun(OperationKind.TOPK, topk_plan, TopkPlanned, catalogue.topk_mutant,
                                      topk_envelope),
        OperationKind.RAGGED_LOGITS: MutantRun(OperationKind.RAGGED_LOGITS, ragged_plan, RaggedPlanned,
                                               catalogue.ragged_mutant, ragged_envelope)}


@dataclasses.dataclass
class OperationTally:
    """What one operation's mutants did: its plan's cases and omissions, each mutant's cases run, failures and
    SKIPs with their case's families, and its first failure."""

    kind: OperationKind
    cases: list[Any]  # the plan's planned cases (.spec, .families), in order
    omissions: list[Any]  # the families it left out (.family, .reason)
    ran: dict[str, int]
    failures: dict[str, Heard]
    skipped: dict[str, Heard]  # a case that ran out of memory (drawn or called) earned no verdict
    first: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def families(self) -> set[str]:
        """The families the plan has cases of."""
        return {f.value for p in self.cases for f in p.families}

    def omitted(self, family: str) -> str | None:
        """Why the plan left `family` out, or None."""
        return next((o.reason for o in self.omissions if o.family.value == family), None)


def operation_envelope(kind: OperationKind, template: Any) -> Any:
    """The contract the mutants of operation `kind` run under in `template`'s envelope (the first one's, for
    the report: they share it)."""
    run = RUNS[kind]
    first = next(spec for spec in catalogue.CATALOGUE if spec.operation == kind)
    return run.envelope(run.mutant(first.key).contract, template)


def run_operations(specs: list[catalogue.MutantSpec], target: Target, config: RunConfig, seed: int, start: float,
                   progress: Progress | None = None, template: Any = None) -> dict[OperationKind, OperationTally]:
    """Every top-k and ragged mutant of `specs`, operation by operation in catalogue order, on its plan's cases
    (seed `seed`), `config.repeat` launches each, those of the template's operation in its envelope (`template`:
    a top-k or ragged contract, or None); `progress` hears a line as each first fails."""
    kinds = dict.fromkeys(spec.operation for spec in specs if spec.operation in RUNS)
    return {kind: _run(RUNS[kind], [s for s in specs if s.operation == kind], target, config, seed, start, progress,
                       template if getattr(template, "operation", None) == kind else None)
            for kind in kinds}


def _run(run: MutantRun, specs: list[catalogue.MutantSpec], target: Target, config: RunConfig, seed: int,
         start: float, progress: Progress | None, template: Any) -> OperationTally:
    """`run`'s mutants of `specs` on its plan. Every one keeps its operation's mutant contract (in `template`'s
    envelope, when there is one): one plan, one oracle answer per case, serve them all."""
    kernels = {spec.name: Named(spec.name, _mutant(run, spec, template)) for spec in specs}
    plan = run.plan(next(iter(kernels.values())).backend.contract, target)
    names = list(kernels)
    cases = [p for p in plan if isinstance(p, run.planned)]
    tally = OperationTally(run.kind, cases, [p for p in plan if not isinstance(p, run.planned)],
                           dict.fromkeys(names, 0), {name: [] for name in names}, {name: [] for name in names})
    # One launch per run_one: the launches are judged one by one here (_launched), each against the oracle.
    in_process = dataclasses.replace(config, isolate=False, timeout=None, metamorphic=(), repeat=1)
    for planned in tally.cases:
        chosen = [kernels[s.name] for s in specs if _wants(s, tally)]
        if not chosen:
            continue
        families = tuple(f.value for f in planned.families)
        for result in _launched(run, planned.spec, chosen, seed, in_process, config.repeat):
            _heard(tally, result, families, start, progress)
    return tally


def _mutant(run: MutantRun, spec: catalogue.MutantSpec, template: Any) -> Any:
    """The catalogue's mutant of `spec`, its contract in `template`'s envelope when there is one."""
    mutant = run.mutant(spec.key)
    if template is not None:
        mutant.contract = run.envelope(mutant.contract, template)
    return mutant


def _launched(run: MutantRun, spec: Any, chosen: list[Named], seed: int, config: RunConfig,
              repeat: int) -> list[CaseResult]:
    """Each chosen mutant's worst of `repeat` launches on the case of `spec`; SKIPs where the case could not
    be drawn for memory."""
    op = run.operation
    drawn = drawn_or_not(op, spec, seed, config.device)
    if isinstance(drawn.case, NotDrawn):
        return run_operation(op, chosen, [drawn], config)
    references: References = []  # the oracle's answer, made on the first launch
    return [_worst([run_one(op, named, drawn.case, config, references=references) for _ in range(repeat)])
            for named in chosen]


def _worst(launches: list[CaseResult]) -> CaseResult:
    """The launch whose verdict is the worst (the first of them)."""
    verdict = worst([r.verdict for r in launches])
    return next(r for r in launches if r.verdict == verdict)


def _heard(tally: OperationTally, result: CaseResult, families: tuple[str, ...], start: float,
           progress: Progress | None) -> None:
    """One mutant's result on a case of `families`: a SKIP earns no verdict; a failure is timed when first."""
    if result.verdict == Verdict.SKIP:
        tally.skipped[result.backend].append((result, families))
        return
    tally.ran[result.backend] += 1
    if not result.verdict.failed:
        return
    tally.failures[result.backend].append((result, families))
    if result.backend not in tally.first:
        tally.first[result.backend] = time.monotonic() - start
        if progress is not None:
            progress(first_failure(result.backend, result.verdict, result.case, families,
                                   tally.first[result.backend]))


def first_failure(mutant: str, verdict: Verdict, case: str, families: tuple[str, ...], seconds: float) -> str:
    """The progress line of a mutant's first failure: 'mutant-x: FAIL(mask) on case-s0 (short-lengths), 1.2 s'."""
    return f"{mutant}: {verdict.value} on {case} ({', '.join(families) or 'no family'}), {seconds:.1f} s"


def _wants(spec: catalogue.MutantSpec, tally: OperationTally) -> bool:
    """Whether `spec` still runs: one that must pass always; another until its expected family (or, where that
    family has no case, anything) failed it."""
    failures = tally.failures[spec.name]
    if spec.must_pass or not failures:
        return True
    expected = spec.caught_by.value  # type: ignore[union-attr]
    if expected not in tally.families:
        return False
    return not any(expected in families for _result, families in failures)
