"""The batch policy: a difftest.engine.batch.Batch launched once per backend, its members judged on
their own rows, and a member that fails there tried again (with the batch's other failures, then
alone) before its result counts.

A member that fails in the batch but passes when tried again is kept in batch.diverged, and its
backend's result on the merged case in batch.whole (a valid case the kernel gets wrong). When the
merged case's oracle runs out of memory, the members run one by one as cases of their own. A member
run alone that runs out of memory is a SKIP with the numbers (difftest.engine.call.finished); in a
launch beside other backends' it is simply run again alone.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from difftest.backends import Loaded
from difftest.core import memory
from difftest.core.case import Case
from difftest.engine.batch import Batch, Retry, joined, merge, padded
from difftest.engine.call import Amend, OutOfMemory, Pending, amended, finished, identity, settle, submit
from difftest.engine.comparison import Comparison, compare_spans
from difftest.engine.config import RunConfig
from difftest.engine.guards import Execution, Outcome
from difftest.engine.isolate import Executor
from difftest.engine.result import CaseResult
from difftest.oracles.reference import Reference, make_reference

# How many times a batch's failed members are run again together, in a batch of their own, before
# those that still fail are run alone. A kernel whose answer depends on its neighbours in the launch
# (DeepGEMM's row after an empty request: a member ending in empty requests spoils the next member's
# first one) fails about a third of a campaign's members in their batch; one launch for all of them,
# where most have other neighbours, replaces most of their one-by-one re-runs. Each round launches them
# in the reverse order of the round before, so that every member has other neighbours than in the last
# launch. The same rule as the first batch: a member that passes in a batch counts as passing.
REBATCH_ROUNDS = 2
# A batch's members run alone that are in flight at once, where the executor queues (a worker over CUDA
# IPC: a call's message is a few handles). Members are small cases (the batch caps), so their shipped
# inputs stay small; with two in flight, the worker waited for this process to take each answer.
RERUNS_IN_FLIGHT = 8

Listener = Callable[[CaseResult], None]
CaseRun = Callable[[Case], list[CaseResult]]  # every backend on one case, as the per-case loop runs it


def started_batch(backends: list[Loaded], executors: list[Executor], batch: Batch, config: RunConfig,
                  on_result: Listener | None, amend: Amend | None, one_case: CaseRun) -> Callable[[], list[CaseResult]]:
    """Every backend's launch on the batch's merged case submitted and the oracle's answer made; what
    finishes the batch: each member judged on its own rows, in (member, backend) order. A member that
    fails there is tried again (_retried), and the retry's result is the one that counts. `one_case` runs
    the members as cases of their own when the merged case's oracle runs out of memory. A Batch is
    never a resumed pair (`done`)."""
    merged = batch.validate().case.to(config.device)
    bases = [identity(b, merged, config) for b in backends]
    pending = [submit(b, merged, config, e, base) for b, e, base in zip(backends, executors, bases, strict=True)]
    try:
        ref = make_reference(merged, config.oracle_kind)  # while the workers compute
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        return lambda: _members_alone(batch, pending, one_case)
    return lambda: _finished_batch(backends, executors, batch, merged, config, on_result,
                                   [wait() for wait in pending], ref, bases, amend)


def _members_alone(batch: Batch, pending: list[Pending], one_case: CaseRun) -> list[CaseResult]:
    """The batch's members run one by one, each with an oracle of its own size, when the merged case's
    oracle ran out of memory; the launches on the merged case are waited for first and dropped."""
    for wait in pending:
        wait()
    return [result for member in batch.members for result in one_case(member)]


def _finished_batch(backends: list[Loaded], executors: list[Executor], batch: Batch, merged: Case, config: RunConfig,
                    on_result: Listener | None, outcomes: list[Outcome | CaseResult | OutOfMemory],
                    ref: Reference, bases: list[dict[str, Any]], amend: Amend | None) -> list[CaseResult]:
    shares = [batch.reference_of(ref, index) for index in range(len(batch.members))]
    in_batch = [_members_judged(backend, executor, outcome, batch, ref, config)
                for backend, executor, outcome in zip(backends, executors, outcomes, strict=True)]
    retried = [_retried(backend, executor, batch, shares, first, config, amend)
               for backend, executor, first in zip(backends, executors, in_batch, strict=True)]
    results = []
    for index in range(len(batch.members)):
        for b, backend in enumerate(backends):
            result, again = in_batch[b][index], retried[b].get(index)
            if again is not None:
                if result is not None and not again.verdict.failed:
                    batch.diverged.append(result)
                    if backend.name not in batch.whole:
                        batch.whole[backend.name] = finished(outcomes[b], ref, backend, merged, config, executors[b],
                                                             bases[b])
                result = again
            if on_result:
                on_result(result)
            results.append(result)
    return results


def _retried(backend: Loaded, executor: Executor, batch: Batch, shares: list[Reference],
             in_batch: list[CaseResult | None], config: RunConfig, amend: Amend | None) -> dict[int, CaseResult]:
    """Member index -> `backend`'s result on it tried again, for each member the batch failed (or gave no
    result). Failed members go into a batch of their own while that leaves fewer failing (at most
    REBATCH_ROUNDS times); those still failing, and those without a result, are run alone. The oracle's
    rows do not depend on the rest of the batch (each row is its own sequence's logits): a member's
    share of the batch's answer is its answer alone. Each launch is recorded in batch.retries."""
    settled: dict[int, CaseResult] = {}
    failing = [index for index, result in enumerate(in_batch) if result is not None and result.verdict.failed]
    for round_index in range(REBATCH_ROUNDS):
        if len(failing) < 2:
            break
        order = failing[::-1] if round_index % 2 else failing
        again = dict(zip(order, _rebatched(backend, executor, batch, shares, order, config), strict=True))
        still = [index for index in failing if again[index] is None or again[index].verdict.failed]
        batch.retries.append(Retry(backend.name, len(failing), len(still)))
        settled.update((index, again[index]) for index in failing if index not in still)
        if len(still) == len(failing):
            break
        failing = still
    alone = sorted(failing + [index for index, result in enumerate(in_batch) if result is None])
    members = [(batch.members[index], shares[index]) for index in alone]
    settled.update(zip(alone, _each_alone(backend, executor, members, config, amend), strict=True))
    batch.retries.extend(Retry(backend.name, 1, int(settled[index].verdict.failed)) for index in alone)
    return settled


def _rebatched(backend: Loaded, executor: Executor, batch: Batch, shares: list[Reference], chosen: list[int],
               config: RunConfig) -> list[CaseResult | None]:
    """`backend`'s result on each chosen member (already validated with the batch), in one launch of
    those members alone together (None: that launch gave no result). The oracle is not run again: its
    answer for them is their shares of the batch's answer, laid end to end (batch.joined)."""
    again = merge([batch.members[index] for index in chosen])
    case = again.case.to(config.device)
    pending = submit(backend, case, config, executor, identity(backend, case, config))
    ref = joined([shares[index] for index in chosen], case.max_model_len)
    return _members_judged(backend, executor, pending(), again, ref, config)


def _each_alone(backend: Loaded, executor: Executor, members: list[tuple[Case, Reference]],
                config: RunConfig, amend: Amend | None) -> list[CaseResult]:
    """`backend` on each member alone, in order. Where the executor queues, several calls are in flight at
    once (_outcomes_in_turn). Their first launches' outputs are compared in one pass, laid end to end
    (_compared_together); a member that fails there is compared again alone, for its full comparison."""
    cases = [member.to(config.device) for member, _share in members]  # validated with their batch
    bases = [identity(backend, case, config) for case in cases]
    outcomes = list(_outcomes_in_turn(backend, executor, cases, bases, config))
    shares = [share for _member, share in members]
    compared = _compared_together(backend, cases, shares, outcomes)
    return [amended(finished(outcome, share, backend, case, config, executor, base, comparison), backend, case,
                    executor, amend)
            for case, share, outcome, base, comparison in zip(cases, shares, outcomes, bases, compared, strict=True)]


def _outcomes_in_turn(backend: Loaded, executor: Executor, cases: list[Case], bases: list[dict[str, Any]],
                      config: RunConfig) -> Iterator[Outcome | CaseResult | OutOfMemory]:
    """The outcome of `backend` on each case, in order; where the executor queues, up to RERUNS_IN_FLIGHT
    calls are sent before the first of them is awaited, so the worker goes from one call to the next
    while this process takes the answers."""
    window = RERUNS_IN_FLIGHT if executor.queues else 1
    in_flight: collections.deque[Pending] = collections.deque()
    for case, base in zip(cases, bases, strict=True):
        if len(in_flight) == window:
            yield in_flight.popleft()()
        in_flight.append(submit(backend, case, config, executor, base))
    while in_flight:
        yield in_flight.popleft()()


def _compared_together(backend: Loaded, cases: list[Case], shares: list[Reference],
                       outcomes: list[Outcome | CaseResult | OutOfMemory]) -> list[Comparison | None]:
    """The comparison of each case's first output, made in one compare_spans pass over the outputs and
    oracle answers laid end to end (padded with -inf to the widest max_model_len: past a case's own
    width nothing is inside a window, and -inf is what every mask convention allows there); None where
    a case fails there (compare it alone, for its full comparison) or cannot be laid out with the others
    (no output, or an output of another shape, dtype or device), and for all when the pass itself runs
    out of memory."""
    firsts = {i: o.outputs[0] for i, (case, o) in enumerate(zip(cases, outcomes, strict=True))
              if isinstance(o, Execution) and tuple(o.outputs[0].shape) == (case.rows, case.max_model_len)}
    fits = list(firsts)
    if len({(out.dtype, out.device) for out in firsts.values()}) != 1 or len(fits) < 2:
        return [None] * len(cases)
    width = max(cases[i].max_model_len for i in fits)
    spans = list(zip(itertools.accumulate((cases[i].rows for i in fits[:-1]), initial=0),
                     (cases[i].rows for i in fits), strict=True))
    try:
        expected = torch.cat([padded(shares[i].logits, width) for i in fits])
        got = torch.cat([padded(firsts[i], width) for i in fits])
        together = compare_spans(expected, got, torch.cat([shares[i].row_lens for i in fits]), backend.contract,
                                 torch.cat([shares[i].bound for i in fits]), spans)
    except Exception as exc:
        if not memory.ran_out(exc):
            raise
        return [None] * len(cases)
    compared: list[Comparison | None] = [None] * len(cases)
    for index, comparison in zip(fits, together, strict=True):
        compared[index] = comparison if comparison is not None and not comparison.verdict.failed else None
    return compared


def _members_judged(backend: Loaded, executor: Executor, outcome: Outcome | CaseResult | OutOfMemory, batch: Batch,
                    ref: Reference, config: RunConfig) -> list[CaseResult | None]:
    """Each member's result from its rows of the batch's outputs, their comparisons made in one pass
    over the first launch's output; None for every member when the call gave no outputs, and for a
    member whose judging ran out of memory (it is run again alone)."""
    if not isinstance(outcome, Execution):
        return [None] * len(batch.members)
    got = outcome.outputs[0]
    compared: list[Comparison | None] = [None] * len(batch.members)  # None: compare each alone
    if tuple(got.shape) == tuple(ref.logits.shape):
        try:
            compared = compare_spans(ref.logits, got, ref.row_lens, backend.contract, ref.bound, batch.spans)
        except Exception as exc:
            if not memory.ran_out(exc):
                raise
    judged = [settle(batch.execution_of(outcome, index), batch.reference_of(ref, index), backend.contract, config,
                     executor, identity(backend, member, config), compared[index])
              for index, member in enumerate(batch.members)]
    return [None if isinstance(result, OutOfMemory) else result for result in judged]
