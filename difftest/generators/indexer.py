"""Indexer cases: IndexerSpec (a paged CaseSpec and the top-k's k) and the tensors it describes. The logits
are drawn as every paged case is (difftest.generators.tensors); k is the index_topk the serving engine
hands the top-k stage (2048 for DeepSeek-V3.2), or a small one where the toy contexts are shorter. The prefill
step's PrefillIndexerSpec is a RaggedSpec and k, its logits drawn as every ragged case is.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

import torch

from difftest.core.case import select_sequences
from difftest.core.indexer import IndexerCase, PrefillIndexerCase
from difftest.core.ragged import MAX_KEYS, RaggedContract
from difftest.core.schema import MAX_MODEL_LEN, Int, Record, validate
from difftest.core.spec import CaseSpec, LengthDist, case_name
from difftest.generators.ragged import RaggedSpec, build_ragged_case, ragged_case_name
from difftest.generators.ragged_shrink import shrink_ragged
from difftest.generators.tensors import build_case

PRODUCTION_K = 2048  # DeepSeek-V3.2's index_topk
TOY_K = 64  # the CPU's toy contexts (128..1024 tokens) hold windows both shorter and longer than it
# Logits elements of the largest case the indexer envelope plans: the exact top-k ranks a float64 copy of
# them. The 2^31-element logits families are the paged-logits operation's (addressing, not selection).
MAX_LOGITS_ELEMENTS = 1 << 27


@dataclasses.dataclass(frozen=True)
class IndexerSpec(Record):
    """A paged case's spec and the k of the top-k stage: the spec's one definition, {'logits': CaseSpec JSON,
    'k': k} as JSON (to_json; IndexerSpec.from_json inverts it)."""

    what = "a JSON object {logits, k}"
    logits: CaseSpec
    k: Int(1, MAX_MODEL_LEN)

    @property
    def name(self) -> str:
        return self.logits.name

    @property
    def elements(self) -> int:
        """Logits elements of a case of this spec: rows * max_model_len."""
        return self.logits.total_batch * self.logits.next_n * self.logits.max_model_len

    @classmethod
    def from_json(cls, data: object, where: str = "") -> IndexerSpec:
        """The spec of to_json's JSON; SpecError naming the field that does not fit ('spec.logits.next_n')."""
        spec = validate(cls, data, where or "spec.", root="spec")
        spec.logits.validate()
        return spec


def build_indexer_case(spec: IndexerSpec, seed: int, device: str | torch.device = "cpu") -> IndexerCase:
    """The paged case of spec.logits drawn with `seed` (build_case), and k."""
    return IndexerCase(build_case(spec.logits, seed, device), spec.k).validate()


def indexer_case_name(spec: IndexerSpec, seed: int) -> str:
    """The name build_indexer_case gives its case (the paged case's)."""
    return case_name(spec.logits, seed)


def random_indexer_spec(rng: random.Random, device: str) -> IndexerSpec:
    """A small decode step: 1..4 requests, next_n 1..3, toy contexts, k below and above the windows."""
    next_n = rng.randint(1, 3)
    max_model_len = rng.choice((128, 256, 520))
    spec = CaseSpec(name="fuzz-indexer", batch=rng.randint(1, 4), next_n=next_n, heads=rng.choice((16, 32, 64)),
                    head_dim=rng.choice((64, 128)), block_size=rng.choice((1, 16, 64)), max_model_len=max_model_len,
                    length_dist=rng.choice(list(LengthDist)))
    return IndexerSpec(spec.validate(), rng.choice((8, TOY_K, 256, PRODUCTION_K)))


def shrink_indexer(case: IndexerCase, still_fails: Callable[[IndexerCase], bool], seconds: float) -> IndexerCase:
    """The smallest case found, within `seconds`, that still fails: one request where one alone fails (the
    first that does), then k halved while it fails. The logits case keeps its pool and max_model_len, so
    every block id and row width means what it meant."""
    deadline = time.monotonic() + seconds
    best = case
    if best.logits.batch > 1:
        for request in range(best.logits.batch):
            if time.monotonic() > deadline:
                break
            # meta: what the drawn case's spec, seed and reach said of all its requests
            one = IndexerCase(dataclasses.replace(select_sequences(best.logits, [request]), meta={}), best.k)
            if still_fails(one):
                best = one
                break
    while best.k > 1 and time.monotonic() < deadline:
        smaller = dataclasses.replace(best, k=best.k // 2)
        if not still_fails(smaller):
            break
        best = smaller
    return best


@dataclasses.dataclass(frozen=True)
class PrefillIndexerSpec(Record):
    """A ragged case's spec and the k of the top-k stage: {'logits': RaggedSpec JSON, 'k': k} as JSON."""

    what = "a JSON object {logits, k}"
    logits: RaggedSpec
    k: Int(1, MAX_KEYS)

    @property
    def name(self) -> str:
        return self.logits.name

    @property
    def elements(self) -> int:
        """Logits elements of a case of this spec in the ABSOLUTE form (the widest): rows * keys."""
        return self.logits.rows * self.logits.keys

    @classmethod
    def from_json(cls, data: object, where: str = "") -> PrefillIndexerSpec:
        """The spec of to_json's JSON; SpecError naming the field that does not fit ('spec.logits.rows')."""
        spec = validate(cls, data, where or "spec.", root="spec")
        spec.logits.validate()
        return spec


def build_prefill_indexer_case(spec: PrefillIndexerSpec, seed: int,
                               device: str | torch.device = "cpu") -> PrefillIndexerCase:
    """The ragged case of spec.logits drawn with `seed` (build_ragged_case), and k."""
    return PrefillIndexerCase(build_ragged_case(spec.logits, seed, device), spec.k).validate()


def prefill_indexer_case_name(spec: PrefillIndexerSpec, seed: int) -> str:
    """The name build_prefill_indexer_case gives its case (the ragged case's)."""
    return ragged_case_name(spec.logits, seed)


def shrink_prefill_indexer(case: PrefillIndexerCase, still_fails: Callable[[PrefillIndexerCase], bool],
                           contract: RaggedContract, seconds: float) -> PrefillIndexerCase:
    """The smallest case found, within `seconds`, that still fails: the ragged case shrunk at this k
    (difftest.generators.ragged_shrink, half the time), then k halved while it fails."""
    deadline = time.monotonic() + seconds
    logits = shrink_ragged(case.logits, lambda smaller: still_fails(PrefillIndexerCase(smaller, case.k)), contract,
                           seconds / 2).case
    best = PrefillIndexerCase(logits, case.k)
    while best.k > 1 and time.monotonic() < deadline:
        smaller = dataclasses.replace(best, k=best.k // 2)
        if not still_fails(smaller):
            break
        best = smaller
    return best
