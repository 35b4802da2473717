"""Consensus: backends judged against each other where no oracle fits (contexts past what the oracle's memory
allows, formats it does not implement): `difftest run --oracle none`.

Masks need no oracle: the true windows come from the case's lengths, so -inf or NaN inside a window, poison,
and (under tail-neg-inf) a finite value past one are judged exactly as against an oracle. Values are judged
against a peer: the first other backend on the case whose output is finite in every window, its tail set to
-inf, within the larger of the two contracts' tolerances (rtol of each row's largest |logit|; no fp32 bound,
neither side being exact). A backend without such a peer is judged on its masks alone.

Where two backends disagree on values, the metamorphic relations (difftest.engine.metamorphic; the run's, or
all of them) are checked on both: the side they fault keeps FAIL(value) with the violations in its result,
and the other passes; where they fault both sides or neither, each keeps FAIL(value) and the reason says that
no side is known right.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import torch

from difftest.backends import Backend, Loaded, as_loaded
from difftest.core.case import Case
from difftest.core.kinds import MetamorphicRelation, OracleKind
from difftest.core.verdict import Verdict
from difftest.engine import metamorphic, runner
from difftest.engine.call import Amend, judged, launch
from difftest.engine.config import RunConfig
from difftest.engine.guards import Execution
from difftest.engine.isolate import Executor
from difftest.engine.result import CaseResult, Violation
from difftest.engine.runner import Done, NotDrawn, Takes, executors_for
from difftest.oracles.reference import Reference


def run(backends: list[Backend], cases: Iterable[Case | NotDrawn], config: RunConfig,
        on_result: Callable[[CaseResult], None] | None = None, done: Done | None = None, takes: Takes | None = None,
        amend: Amend | None = None) -> list[CaseResult]:
    """Every backend on every case (the pairs `takes` allows; `done` keeps results of an earlier run), judged by
    consensus; results in (case, backend) order, each fresh one through `amend` before it reaches `on_result`."""
    loaded = [as_loaded(backend, f"backends[{index}]") for index, backend in enumerate(backends)]
    kept = done or {}
    results: list[CaseResult] = []
    with executors_for(loaded, config) as where:
        for case in cases:
            chosen = [i for i, b in enumerate(loaded) if takes is None or takes(b.name, case)]
            if isinstance(case, NotDrawn):  # its SKIPs, as the runner gives them
                results += runner.run([loaded[i] for i in chosen], [case], config, on_result)
                continue
            todo = [i for i in chosen if (loaded[i].name, case.name) not in kept]
            fresh = dict(zip(todo, judge_case([loaded[i] for i in todo], [where[i] for i in todo], case, config),
                             strict=True))
            for index in todo:
                fresh[index] = amend(fresh[index], loaded[index], case, where[index]) if amend else fresh[index]
                if on_result:
                    on_result(fresh[index])
            results += [fresh[i] if i in fresh else kept[(loaded[i].name, case.name)] for i in chosen]
    return results


def judge_case(backends: list[Loaded], executors: list[Executor], case: Case, config: RunConfig) -> list[CaseResult]:
    """Each backend's result on `case`, its masks against the true windows and its values against a peer's."""
    case = case.validate().to(config.device)
    once = dataclasses.replace(config, repeat=1, time=None)
    launched = [launch(b, case, once, e) for b, e in zip(backends, executors, strict=True)]
    relations = _Relations(backends, executors, case, config)
    results = []
    for index, (backend, outcome) in enumerate(zip(backends, launched, strict=True)):
        if not isinstance(outcome, Execution):
            results.append(outcome)
            continue
        peer = _peer(index, backends, launched, case)
        ref = _reference(case, launched[peer].outputs[0] if peer is not None else None)  # type: ignore[union-attr]
        # Within the larger of the two tolerances: neither side is the truth.
        rtol = max(backend.contract.rtol, backends[peer].contract.rtol) if peer is not None else backend.contract.rtol
        contract = dataclasses.replace(backend.contract, rtol=rtol)
        result = judged(backend, case, once, outcome, ref, executors[index], contract)
        results.append(_settled(result, backend, backends[peer] if peer is not None else None, relations))
    return results


def _peer(index: int, backends: list[Loaded], launched: list[Execution | CaseResult], case: Case) -> int | None:
    """The first other backend whose output is finite in every window: the values' reference."""
    inside = _inside(case)
    for other, outcome in enumerate(launched):
        if other != index and isinstance(outcome, Execution):
            out = outcome.outputs[0]
            if tuple(out.shape) == tuple(inside.shape) and bool(torch.isfinite(out.double()[inside]).all()):
                return other
    return None


def _inside(case: Case) -> torch.Tensor:
    """(rows, max_model_len) bool: the positions inside each row's window."""
    positions = torch.arange(case.max_model_len, device=case.device)
    return positions[None, :] < case.row_lens().reshape(-1, 1)


def _reference(case: Case, peer: torch.Tensor | None) -> Reference:
    """The peer's logits with every tail -inf (no rounding bound: neither side is exact); without a peer, zeros
    in the windows and an unbounded tolerance, so only the masks are judged."""
    inside = _inside(case)
    row_lens = case.row_lens().reshape(-1)
    if peer is None:
        logits = torch.where(inside, 0.0, -math.inf).to(torch.float64)
        return Reference(logits, row_lens, torch.full_like(row_lens, math.inf, dtype=torch.float32), OracleKind.NONE,
                         case.next_n)
    logits = torch.where(inside, peer.to(case.device).double(), -math.inf)
    return Reference(logits, row_lens, torch.zeros(case.rows, device=case.device), OracleKind.NONE, case.next_n)


class _Relations:
    """The relations checked on each backend of a case, at most once each: who they fault."""

    def __init__(self, backends: list[Loaded], executors: list[Executor], case: Case, config: RunConfig) -> None:
        self.where = {b.name: e for b, e in zip(backends, executors, strict=True)}
        self.case, self.config = case, config
        self.relations = config.metamorphic or tuple(MetamorphicRelation)
        self.found: dict[str, tuple[Violation, ...]] = {}

    def of(self, backend: Loaded) -> tuple[Violation, ...]:
        """The relations `backend` violates on the case."""
        if backend.name not in self.found:
            self.found[backend.name] = metamorphic.check(backend, self.case, self.relations, self.config,
                                                         self.where[backend.name])
        return self.found[backend.name]


def _settled(result: CaseResult, backend: Loaded, peer: Loaded | None, relations: _Relations) -> CaseResult:
    """`result` with its consensus said: agreed, or a value disagreement settled by the relations."""
    if peer is None:
        return dataclasses.replace(result, reason="no other backend gave an output finite in every window: only "
                                                  "the masks were judged")
    if result.verdict != Verdict.FAIL_VALUE:
        return dataclasses.replace(result, reason=f"values judged against {peer.name}")
    mine, theirs = relations.of(backend), relations.of(peer)
    rows = result.comparison.value_rows[:8] if result.comparison else []
    head = f"disagrees with {peer.name} on values (rows {rows}...)"
    if mine and not theirs:
        return dataclasses.replace(result, metamorphic=mine, reason=f"{head}: the relations fault {backend.name} "
                                   f"({', '.join(v.relation.value for v in mine)})")
    if theirs and not mine:
        return dataclasses.replace(result, verdict=Verdict.PASS, reason=f"{head}: the relations fault {peer.name} "
                                   f"({', '.join(v.relation.value for v in theirs)}), not {backend.name}")
    which = "both sides" if mine else "neither side"
    return dataclasses.replace(result, metamorphic=mine, reason=f"{head}: the relations fault {which}; no side is "
                               "known right")
