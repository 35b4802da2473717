"""The prefill indexer operation: a prefill step end to end, a ragged logits backend followed by a top-k backend
ranking each query row inside its key window (a composition: difftest.backends.stages.PREFILL_COMPOSITIONS by
default, or any 'RAGGED+TOPK' of two stages, difftest.backends.registry),
as vLLM's prefill composes fp8_mqa_logits with top_k_per_row_prefill.

The oracle, the headline and the verdict are the decode indexer's (difftest.operations.indexer): the tie-aware
top-k of the exact logits, within twice each row's rounding bound, and the selected set judged beside the
logits stage's -inf mask (here the ragged comparison). The windows are those of the logits stage's output
form: [k_start, k_end) of absolute logits, [0, k_end - k_start) of window-relative ones.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from difftest.backends.base import Loaded
from difftest.backends.registry import operation_names
from difftest.backends.stages import Composed, composed
from difftest.core.indexer import IndexerContract, PrefillIndexerCase
from difftest.core.kinds import Headline, LogitsForm, OperationKind, OracleKind
from difftest.core.operation import Expected, Operation, Planned
from difftest.engine.result import Judgement
from difftest.engine.stability import Stability, ragged_stability
from difftest.generators.indexer import (
    MAX_LOGITS_ELEMENTS,
    TOY_K,
    PrefillIndexerSpec,
    build_prefill_indexer_case,
    prefill_indexer_case_name,
    shrink_prefill_indexer,
)
from difftest.generators.ragged import default_ragged_specs
from difftest.operations import indexer, ragged, topk
from difftest.oracles.ragged_mqa_logits import absolute
from difftest.oracles.topk import topk_within


def envelope(contract: IndexerContract, device: str) -> list[Planned]:
    """The logits stage's envelope (difftest.operations.ragged.envelope) at the planned k, less the cases the
    top-k stage refuses by shape and those past MAX_LOGITS_ELEMENTS."""
    k, planned = indexer.topk_k(contract.topk, device), []
    for item in ragged.envelope(contract.logits, device):
        spec = PrefillIndexerSpec(item.spec, k)
        rows, keys = item.spec.rows, item.spec.keys
        if spec.elements <= MAX_LOGITS_ELEMENTS and contract.topk.shape_reason(rows, keys, keys, k) is None:
            planned.append(Planned(spec, item.families))
    return planned


def suite() -> list[PrefillIndexerSpec]:
    """The ragged operation's random suite at the toy k."""
    return [PrefillIndexerSpec(spec, TOY_K) for spec in default_ragged_specs()]


def random_spec(rng: random.Random, device: str) -> PrefillIndexerSpec:
    """A small ragged spec (difftest.operations.ragged.random_spec) and a k below and above its windows."""
    return PrefillIndexerSpec(ragged.random_spec(rng, device), rng.choice((1, 8, TOY_K, 256)))


def reference(case: PrefillIndexerCase, contract: IndexerContract, oracle: OracleKind) -> indexer.IndexerTruth:
    """The ragged oracle's logits, and the tie-aware top-k of them, in the logits stage's form, within the
    selection band (difftest.operations.indexer.selection_band)."""
    logits = ragged.reference(case.logits, contract.logits, oracle)
    exact = logits.logits
    if contract.logits.form == LogitsForm.ABSOLUTE:
        exact = absolute(exact, case.logits.k_start, case.logits.keys)
    starts, ends = case.windows(contract.logits.form)
    band = indexer.selection_band(exact, starts, ends, contract.logits.rtol, logits.bound)
    ranked, truth = topk_within(exact, starts, ends, case.k, band, contract.topk.nan)
    return indexer.IndexerTruth(logits, ranked, truth)


def call(backend: Composed | Loaded, case: PrefillIndexerCase) -> indexer.Staged:
    """The logits stage on the ragged case, then the top-k stage on the logits as written, each row windowed
    by its key window."""
    backend = composed(backend)
    logits = ragged.call(backend.logits, case.logits)
    expected = (case.rows, backend.logits.contract.width(case.logits))
    if tuple(logits.shape) != expected:
        raise ValueError(f"logits stage {backend.logits.name} returned logits of shape {tuple(logits.shape)}, "
                         f"expected {expected}")
    stage = case.topk_case(indexer.rows_in_memory(logits.float()), backend.logits.contract)
    reason = backend.topk.contract.accepts(stage, str(case.device.type))
    if reason:
        raise ValueError(f"top-k stage {backend.topk.name} cannot take the logits as written: {reason}")
    return indexer.Staged(logits, topk.call(backend.topk, stage))


def judge(truth: indexer.IndexerTruth, got: indexer.Staged, case: PrefillIndexerCase,
          contract: IndexerContract) -> Judgement:
    """The selected set against the oracle's (order not judged) and the logits stage's ragged comparison."""
    stage = ragged.judge(truth.logits, got.logits, case.logits, contract.logits)
    return indexer.judged_selection(truth, got, case.topk_case(truth.ranked, contract.logits), contract, stage)


def output(case: PrefillIndexerCase, contract: IndexerContract) -> tuple[Expected, ...]:
    """The logits stage's logits (the ragged operation's) and the top-k stage's indices (the top-k operation's)."""
    return indexer.staged_output(ragged.output(case.logits, contract.logits)[0], case)


def stability(truth: indexer.IndexerTruth, outputs: tuple[Any, ...], case: PrefillIndexerCase,
              contract: IndexerContract) -> Stability:
    """The logits stage's launches as ragged logits agree, and the selections as top-k indices do, in one
    record."""
    logits = ragged_stability(truth.logits, tuple(o.logits for o in outputs), case.logits, contract.logits)
    return indexer.staged_stability(logits, truth, outputs, case.topk_case(truth.ranked, contract.logits), contract)


def watched(backend: Composed | Loaded, watch: Callable[..., Any]) -> Composed:
    """Both stages watched, each under its stage's name (ragged logits, then top-k)."""
    return indexer.watched_stages(backend, watch, ragged.watched)


def shrink(case: PrefillIndexerCase, still_fails: Any, contract: IndexerContract, seconds: float) -> PrefillIndexerCase:
    """The ragged case shrunk, then a smaller k (difftest.generators.indexer.shrink_prefill_indexer)."""
    return shrink_prefill_indexer(case, still_fails, contract.logits, seconds)


PREFILL_INDEXER = Operation(
    kind=OperationKind.PREFILL_INDEXER, summary="prefill end to end: ragged logits, then top-k of each row's window",
    headlines=(Headline.SELECTION, Headline.MASK), case_type=PrefillIndexerCase, spec_type=PrefillIndexerSpec,
    contract_type=IndexerContract, backends=functools.partial(operation_names, OperationKind.PREFILL_INDEXER),
    suite=suite, envelope=envelope, random_spec=random_spec,
    build=build_prefill_indexer_case, case_name=prefill_indexer_case_name, load_case=PrefillIndexerCase.load,
    reference=reference, call=call, judge=judge, shrink=shrink, relate=None,
    output=output, stability=stability, watched=watched)
