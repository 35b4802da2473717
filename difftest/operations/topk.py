"""The top-k operation: the k largest logits of each row's window as indices (difftest.core.topk), judged
against the tie-aware oracle; the headline is the rows whose selected set is wrong, and the tokens off."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from difftest.backends.stages import topk_backends
from difftest.core.kinds import Device, Headline, OperationKind, OracleKind
from difftest.core.operation import Expected, Operation, Planned
from difftest.core.topk import TopkCase, TopkContract, encode_topk
from difftest.engine.result import Judgement, Selection
from difftest.engine.stability import Stability, index_stability
from difftest.engine.topk_comparison import TopkComparison, compare_topk
from difftest.engine.topk_metamorphic import relate
from difftest.generators.envelope import Scale, Target
from difftest.generators.topk import (
    Outside,
    TopkPlanned,
    TopkSpec,
    TopkValues,
    WindowDist,
    build_topk_case,
    default_topk_specs,
    topk_case_name,
    topk_plan,
)
from difftest.generators.topk_shrink import shrink_topk
from difftest.oracles.topk import TopkTruth
from difftest.oracles.topk import reference as topk_reference


def envelope(contract: TopkContract, device: str) -> list[Planned]:
    """The specs of topk_plan (every edge family the contract takes) at this device's scale."""
    target = Target.probe(Device(device), Scale.PRODUCTION if device == "cuda" else Scale.SMALL)
    return [Planned(item.spec, tuple(f.value for f in item.families))
            for item in topk_plan(contract, target) if isinstance(item, TopkPlanned)]


def random_spec(rng: random.Random, device: str) -> TopkSpec:
    """A small spec: k in {8, 64, 512}, rows of 1..3k columns, every value and window distribution, ties; in
    about half the specs the values real kernels meet (_special_counts): +inf, NaN, rows of all -inf."""
    k = rng.choice((8, 64, 512))
    windows = rng.choice(list(WindowDist))
    next_n = rng.choice((1, 2)) if windows == WindowDist.DECODE else 1
    rows = next_n * rng.randint(1, 6)
    width = 4 * rng.randint(max(1, k // 8), k)
    values = rng.choice(list(TopkValues))
    return TopkSpec(name=f"fuzz-{values.value}-{windows.value}", rows=rows, width=width, k=k, windows=windows,
                    next_n=next_n, values=values, ties=(rng.randint(0, k),), outside=rng.choice(list(Outside)),
                    **_special_counts(rng, k, width))


def _special_counts(rng: random.Random, k: int, width: int) -> dict[str, Any]:
    """+inf per row (none in half the specs; else 1, k - 1, k or k + 1: the k-th a tie of +inf), NaN per row
    (none in three specs of four; else 1 or 2) and candidates per row (all in half the specs; else cycles with
    rows of no candidate, one, k - 1, before and after full rows)."""
    pos_infs = rng.choice((0, 0, 0, 0, 1, k - 1, k, k + 1))
    nans = rng.choice((0, 0, 0, 0, 0, 0, 1, 2))
    finite = rng.choice((None, None, None, (0, width), (width, 1, width, k - 1), (0, 0, width)))
    return {"pos_infs": pos_infs, "nans": nans, "finite": finite}


def reference(case: TopkCase, contract: TopkContract, oracle: OracleKind) -> TopkTruth:
    """The tie-aware truth at the contract's NaN ranking (one oracle: exact)."""
    return topk_reference(case, contract.nan)


def call(backend: Any, case: TopkCase) -> Any:
    """The backend on the case, its windows in the contract's form (encode_topk)."""
    return backend(encode_topk(case, backend.contract), None)


INDEX_DTYPES = (torch.int32, torch.int64)  # what every top-k kernel of the field returns its indices as


def output(case: TopkCase, contract: TopkContract) -> tuple[Expected, ...]:
    """Integer indices [rows, k] on the case's device: a float index is no column (vllm#49896's NaN ones)."""
    return (Expected("indices", INDEX_DTYPES, (case.rows, case.k), case.device.type),)


def stability(truth: TopkTruth, outputs: tuple[Any, ...], case: TopkCase, contract: TopkContract) -> Stability:
    """Rows whose indices moved between launches are stable within tolerance where every launch's pick is right
    (another choice among tied values), unstable where one is wrong."""
    return index_stability(outputs, lambda got: wrong_rows(compare_topk(truth, got, case, contract)))


def wrong_rows(judged: TopkComparison) -> set[int]:
    """Every row a top-k comparison faults (its wrong set, its order where promised)."""
    return {row for rows in judged.rows_by_verdict.values() for row in rows}


def watched(backend: Any, watch: Callable[..., Any]) -> Any:
    """The backend, allowed to write into its logits where its contract says it does (it is handed a copy)."""
    return watch(backend, writes=("logits",) if backend.contract.mutates_logits else ())


def selection_of(judged: TopkComparison) -> Selection:
    """The selected-set record of a top-k comparison."""
    return Selection(rows=judged.rows, wrong_rows=judged.wrong_rows, wrong_tokens=sum(judged.wrong_tokens),
                     symptoms={kind.value: rows for kind, rows in judged.symptoms.items() if rows},
                     first=judged.first_mismatch.describe() if judged.first_mismatch else None, pattern=judged.pattern)


def judge(truth: TopkTruth, got: Any, case: TopkCase, contract: TopkContract) -> Judgement:
    """The tie-aware top-k comparison (difftest.engine.topk_comparison)."""
    judged = compare_topk(truth, got, case, contract)
    return Judgement(judged.verdict, judged.headline(), selection=selection_of(judged))


def shrink(case: TopkCase, still_fails: Any, contract: TopkContract, seconds: float) -> TopkCase:
    """Fewer rows, narrower rows, a smaller k, simpler values (difftest.generators.topk_shrink)."""
    return shrink_topk(case, still_fails, contract, seconds).case


TOPK = Operation(
    kind=OperationKind.TOPK, summary="the k largest logits of each row's window, as indices",
    headlines=(Headline.SELECTION,), case_type=TopkCase, spec_type=TopkSpec, contract_type=TopkContract,
    backends=topk_backends, suite=default_topk_specs, envelope=envelope, random_spec=random_spec,
    build=build_topk_case, case_name=topk_case_name, load_case=TopkCase.load, reference=reference, call=call,
    judge=judge, shrink=shrink, relate=relate,
    output=output, stability=stability, watched=watched)

