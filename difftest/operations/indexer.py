"""The indexer operation: a decode step end to end, a paged logits backend followed by a top-k backend on the
logits it wrote (a composition: difftest.backends.stages.COMPOSITIONS by default, or any 'LOGITS+TOPK' of two
stages, difftest.backends.registry), as a serving engine composes them.

The oracle is the tie-aware top-k of the exact logits. A right logits stage is only within the tolerance its
contract is judged by (rtol times the row's largest logit, or the fp32 rounding bound), so a candidate within
twice that of the exact k-th value may land on either side of it in a right pipeline: the oracle ranks those as
ties (selection_band, difftest.oracles.topk.topk_within). The judgement
has two parts, both in the headline: the rows whose selected set differs (and by how many tokens), and the
rows whose -inf mask the logits stage got wrong (the paged comparison). The verdict is the selection's when
the selected set is wrong (what the pipeline gets wrong first: shrinking keeps it), else the logits stage's;
the order of a row's indices is not judged (the pipeline's product is a set).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from difftest.backends.base import Loaded
from difftest.backends.registry import operation_names
from difftest.backends.stages import Composed, composed
from difftest.core.indexer import IndexerCase, IndexerContract, PrefillIndexerCase
from difftest.core.kinds import Headline, OperationKind, OracleKind
from difftest.core.operation import Expected, Operation, Planned
from difftest.core.topk import TopkCase, TopkContract
from difftest.core.verdict import worst
from difftest.engine.comparison import tolerance
from difftest.engine.result import Judgement
from difftest.engine.stability import Stability, combined, index_stability
from difftest.engine.topk_comparison import TopkComparison, compare_topk
from difftest.generators.indexer import (
    MAX_LOGITS_ELEMENTS,
    PRODUCTION_K,
    TOY_K,
    IndexerSpec,
    build_indexer_case,
    indexer_case_name,
    random_indexer_spec,
    shrink_indexer,
)
from difftest.operations import paged, topk
from difftest.oracles.ragged_reference import RaggedReference
from difftest.oracles.reference import Reference
from difftest.oracles.topk import TopkTruth, topk_within


@dataclasses.dataclass(frozen=True)
class Staged:
    """What a composition computed: its logits stage's logits and its top-k stage's indices."""

    logits: torch.Tensor
    indices: torch.Tensor


@dataclasses.dataclass(frozen=True)
class IndexerTruth:
    """The oracle's logits (paged reference) and what a right top-k of them selects."""

    logits: Reference | RaggedReference
    ranked: torch.Tensor  # float64 [rows, logits width]: the exact logits, near-ties of the k-th value made ties
    truth: TopkTruth


def topk_k(contract: TopkContract, device: str) -> int:
    """The k an envelope case is planned at: DeepSeek-V3.2's on a GPU, a toy one on the CPU, or the largest k
    the top-k stage takes when it takes neither."""
    k = PRODUCTION_K if device == "cuda" else TOY_K
    return k if contract.ks is None or k in contract.ks else max(contract.ks)


def envelope(contract: IndexerContract, device: str) -> list[Planned]:
    """The logits stage's envelope (difftest.operations.paged.envelope) at the planned k, less the cases the top-k
    stage refuses by shape and those past MAX_LOGITS_ELEMENTS (the paged-logits operation's to reach)."""
    k, planned = topk_k(contract.topk, device), []
    for item in paged.envelope(contract.logits, device):
        spec = IndexerSpec(item.spec, k)
        width, rows = item.spec.max_model_len, item.spec.total_batch * item.spec.next_n
        if spec.elements <= MAX_LOGITS_ELEMENTS and contract.topk.shape_reason(rows, width, width, k) is None:
            planned.append(Planned(spec, item.families))
    return planned


def suite() -> list[IndexerSpec]:
    """The paged operation's toy suite at the toy k."""
    return [IndexerSpec(spec, TOY_K) for spec in paged.suite()]


def reference(case: IndexerCase, contract: IndexerContract, oracle: OracleKind) -> IndexerTruth:
    """The paged oracle's logits, and the tie-aware top-k of them within the selection band."""
    logits = paged.reference(case.logits, contract.logits, oracle)
    starts, ends = case.windows()
    band = selection_band(logits.logits, starts, ends, contract.logits.rtol, logits.bound)
    ranked, truth = topk_within(logits.logits, starts, ends, case.k, band, contract.topk.nan)
    return IndexerTruth(logits, ranked, truth)


def selection_band(exact: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, rtol: float,
                   bound: torch.Tensor) -> torch.Tensor:
    """(rows,) how far a candidate's exact logit may lie from its row's exact k-th and still rank on either side
    of it in a pipeline whose logits stage is right: twice the tolerance the logits stage is judged by (its
    contract's rtol times the row's largest logit, or the oracle's rounding bound, whichever is larger), as the
    candidate and the k-th may each be off by it. A logits stage off by more fails on its own."""
    columns = torch.arange(exact.shape[1], device=starts.device)
    inside = (columns >= starts[:, None]) & (columns < ends[:, None])
    return 2 * tolerance(exact.to(starts.device), inside, rtol, bound.to(starts.device))


def call(backend: Composed | Loaded, case: IndexerCase) -> Staged:
    """The logits stage on the paged case, then the top-k stage on the logits as written (their row stride
    kept, as a serving engine hands them on), windowed by the decode rule."""
    backend = composed(backend)
    logits = paged.call(backend.logits, case.logits)
    expected = (case.rows, case.logits.max_model_len)
    if tuple(logits.shape) != expected:
        raise ValueError(f"logits stage {backend.logits.name} returned logits of shape {tuple(logits.shape)}, "
                         f"expected {expected}")
    stage = case.topk_case(rows_in_memory(logits.float()))
    reason = backend.topk.contract.accepts(stage, str(case.device.type))
    if reason:
        raise ValueError(f"top-k stage {backend.topk.name} cannot take the logits as written: {reason}")
    return Staged(logits, topk.call(backend.topk, stage))


def rows_in_memory(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits [rows, width] as the memory a top-k kernel walks: [rows, row_stride] over the same
    storage when the rows are padded (DeepGEMM aligns its row stride), a contiguous copy when their
    layout is anything else."""
    rows, width = logits.shape
    stride = logits.stride(0)
    room = logits.untyped_storage().nbytes() // logits.element_size() - logits.storage_offset()
    if rows and logits.stride(1) == 1 and stride >= width and rows * stride <= room:
        return logits.as_strided((rows, stride), (stride, 1))
    return logits.contiguous()


def judge(truth: IndexerTruth, got: Staged, case: IndexerCase, contract: IndexerContract) -> Judgement:
    """The selected set against the oracle's (order not judged) and the logits stage's -inf mask."""
    stage = paged.judge(truth.logits, got.logits, case.logits, contract.logits)
    return judged_selection(truth, got, case.topk_case(truth.ranked), contract, stage)


def judged_selection(truth: IndexerTruth, got: Staged, ranked: TopkCase, contract: IndexerContract,
                     stage: Judgement) -> Judgement:
    """The selected set against the oracle's, its picks' values read from the exact logits in `ranked`, beside
    the logits stage's judgement `stage`: the selection's verdict when it failed, else the worse of both."""
    chosen = selected(truth, got.indices, ranked, contract)
    verdict = chosen.verdict if chosen.verdict.failed else worst([chosen.verdict, stage.verdict])
    return Judgement(verdict, f"{chosen.headline()}; logits stage: {stage.headline}", comparison=stage.comparison,
                     selection=topk.selection_of(chosen))


def selected(truth: IndexerTruth, indices: torch.Tensor, ranked: TopkCase, contract: IndexerContract) -> TopkComparison:
    """The selected set of `indices` against the oracle's, order not judged (the pipeline's product is a set)."""
    return compare_topk(truth.truth, indices, ranked, dataclasses.replace(contract.topk, sorted=False))


def output(case: IndexerCase, contract: IndexerContract) -> tuple[Expected, ...]:
    """The logits stage's logits (the paged operation's) and the top-k stage's indices (the top-k operation's)."""
    return staged_output(paged.output(case.logits, contract.logits)[0], case)


def staged_output(logits: Expected, case: IndexerCase | PrefillIndexerCase) -> tuple[Expected, ...]:
    """A composition's Expected: its logits stage's `logits` as Staged.logits, integer indices [rows, k] as
    Staged.indices."""
    return (dataclasses.replace(logits, part="logits"),
            Expected("indices", topk.INDEX_DTYPES, (case.rows, case.k), logits.device, part="indices"))


def stability(truth: IndexerTruth, outputs: tuple[Any, ...], case: IndexerCase, contract: IndexerContract) -> Stability:
    """The logits stage's launches as paged logits agree, and the selections as top-k indices do, in one record."""
    logits = paged.stability(truth.logits, tuple(o.logits for o in outputs), case.logits, contract.logits)
    return staged_stability(logits, truth, outputs, case.topk_case(truth.ranked), contract)


def staged_stability(logits: Stability, truth: IndexerTruth, outputs: tuple[Any, ...], ranked: TopkCase,
                     contract: IndexerContract) -> Stability:
    """`logits` (the logits stage's record) and the selections' (index_stability against the selected set) as
    one."""
    chosen = index_stability(tuple(o.indices for o in outputs),
                             lambda got: topk.wrong_rows(selected(truth, got, ranked, contract)))
    return combined((logits, chosen))


def watched(backend: Composed | Loaded, watch: Callable[..., Any]) -> Composed:
    """Both stages watched, each under its stage's name (paged logits, then top-k)."""
    return watched_stages(backend, watch, paged.watched)


def watched_stages(backend: Composed | Loaded, watch: Callable[..., Any], logits: Callable[..., Any]) -> Composed:
    """`backend` with its logits stage watched as `logits` (its operation's watched) says and its top-k stage
    as the top-k operation's does, a change named with the stage. A loaded composition (the registry's Loaded,
    which keeps its origin) is watched as the composition it wraps: the watched one is called, not rebuilt."""
    if isinstance(backend, Loaded):
        backend = backend.backend
    return dataclasses.replace(backend, logits=logits(backend.logits, functools.partial(watch, stage="logits stage")),
                               topk=topk.watched(backend.topk, functools.partial(watch, stage="top-k stage")))


def shrink(case: IndexerCase, still_fails: Any, contract: IndexerContract, seconds: float) -> IndexerCase:
    """One request where one alone fails, then a smaller k (difftest.generators.indexer.shrink_indexer)."""
    return shrink_indexer(case, still_fails, seconds)


INDEXER = Operation(
    kind=OperationKind.INDEXER, summary="decode end to end: paged logits, then top-k (the selected token set)",
    headlines=(Headline.SELECTION, Headline.MASK), case_type=IndexerCase, spec_type=IndexerSpec,
    contract_type=IndexerContract, backends=functools.partial(operation_names, OperationKind.INDEXER), suite=suite,
    envelope=envelope,
    random_spec=random_indexer_spec, build=build_indexer_case, case_name=indexer_case_name,
    load_case=IndexerCase.load, reference=reference, call=call, judge=judge, shrink=shrink, relate=None,
    output=output, stability=stability, watched=watched)
