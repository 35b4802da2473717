"""The top-k part of `difftest selftest`: the top-k mutants (difftest.backends.topk_mutants) on the top-k plan
(difftest.generators.topk.topk_plan for their contract at the run's scale), each launch judged by the tie-aware
oracle (difftest.engine.topk_comparison), in this process: the engine's runner takes paged cases only.

As for the paged mutants, one that must pass runs every case, and another stops once a case of the family it
names has failed (at its first failure where that family has no case here). Each case runs `repeat` launches,
each judged: a choice among ties that moves from launch to launch must be right every time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from difftest.backends import mutants as catalogue
from difftest.backends.topk_mutants import TorchTopkMutant
from difftest.core.topk import TopkCase, encode_topk
from difftest.core.verdict import Verdict, worst
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Target
from difftest.generators.topk import TopkOmission, TopkPlanned, build_topk_case, topk_plan
from difftest.oracles.topk import reference


@dataclasses.dataclass(frozen=True)
class TopkFailure:
    """A top-k mutant's failing case, in the fields a score reads of a CaseResult."""

    case: str
    verdict: Verdict
    reason: str


@dataclasses.dataclass
class TopkTally:
    """What the top-k mutants did: cases run, failures with their case's families, each one's first failure."""

    plan: list[TopkPlanned | TopkOmission]
    ran: dict[str, int]
    failures: dict[str, list[tuple[TopkFailure, tuple[str, ...]]]]
    first: dict[str, float]

    @property
    def families(self) -> set[str]:
        """The families the plan has cases of."""
        return {f.value for p in self.plan if isinstance(p, TopkPlanned) for f in p.families}

    def omitted(self, family: str) -> str | None:
        """Why the plan left `family` out, or None."""
        return next((o.reason for o in self.plan if isinstance(o, TopkOmission) and o.family.value == family), None)


def run_topk(specs: list[catalogue.MutantSpec], target: Target, device: str, repeat: int, seed: int,
             start: float, progress: Callable[[str], None] | None = None) -> TopkTally:
    """Every top-k mutant of `specs` on the plan's cases (seed `seed`), `repeat` launches each; `progress` hears
    a line as each first fails."""
    kernels = {spec.name: catalogue.topk_mutant(spec.key) for spec in specs}
    # Every top-k mutant keeps torch top-k's contract: one plan serves them all.
    plan = topk_plan(next(iter(kernels.values())).contract, target) if kernels else []
    tally = TopkTally(plan, dict.fromkeys(kernels, 0), {name: [] for name in kernels}, {})
    for planned in (p for p in plan if isinstance(p, TopkPlanned)):
        chosen = [s for s in specs if _wants(s, tally, planned)]
        if not chosen:
            continue
        case = build_topk_case(planned.spec, seed, device)
        for spec in chosen:
            tally.ran[spec.name] += 1
            failure = _judged(kernels[spec.name], case, repeat)
            if failure is not None:
                families = tuple(f.value for f in planned.families)
                tally.failures[spec.name].append((failure, families))
                if spec.name not in tally.first:
                    tally.first[spec.name] = time.monotonic() - start
                    if progress is not None:
                        progress(first_failure(spec.name, failure.verdict, failure.case, families,
                                               tally.first[spec.name]))
    return tally


def first_failure(mutant: str, verdict: Verdict, case: str, families: tuple[str, ...], seconds: float) -> str:
    """The progress line of a mutant's first failure: 'mutant-x: FAIL(mask) on case-s0 (short-lengths), 1.2 s'."""
    return f"{mutant}: {verdict.value} on {case} ({', '.join(families) or 'no family'}), {seconds:.1f} s"


def _wants(spec: catalogue.MutantSpec, tally: TopkTally, planned: TopkPlanned) -> bool:
    """Whether `spec` still runs: one that must pass always; another until its expected family (or, where that
    family has no case, anything) failed it."""
    failures = tally.failures[spec.name]
    if spec.must_pass or not failures:
        return True
    expected = spec.caught_by.value  # type: ignore[union-attr]
    if expected not in tally.families:
        return False
    return not any(expected in families for _failure, families in failures)


def _judged(kernel: TorchTopkMutant, case: TopkCase, repeat: int) -> TopkFailure | None:
    """The worst of `repeat` launches of `kernel` on `case`, None when every one is right."""
    truth = reference(case, kernel.contract.nan)
    judged = [compare_topk(truth, kernel(encode_topk(case, kernel.contract), None), case, kernel.contract)
              for _ in range(repeat)]
    verdict = worst([j.verdict for j in judged])
    if not verdict.failed:
        return None
    first = next(j for j in judged if j.verdict == verdict)
    return TopkFailure(case.name, verdict, first.headline())
