"""The CPU port of SGLang 0.5.23's JIT fast_topk (scripts/sglang_fast_topk_port.py), the second method of
docs/findings/sglang-fast-topk-crowded-bin.md: as written it drops the coarse threshold bin's candidates past
the 4096th and returns what the H200 returned on difftest's crowded-bin cases; with the limit lifted it is
exact. Every verdict here is difftest's own (compare_topk against the tie-aware oracle)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from difftest.backends.sglang_topk import SglangJitTopk
from difftest.core.topk import TopkCase
from difftest.core.verdict import Verdict
from difftest.engine.topk_comparison import TopkComparison, compare_topk
from difftest.generators.topk import TopkSpec, TopkValues, WindowDist, build_topk_case
from difftest.oracles.topk import reference
from scripts import sglang_fast_topk_port as port

CONTRACT = SglangJitTopk("sglang-jit-fast-topk").contract


def judged(case: TopkCase, stash_entries: int | None = port.STASH_ENTRIES) -> TopkComparison:
    return compare_topk(reference(case, CONTRACT.nan), port.fast_topk(case, stash_entries), case, CONTRACT)


def test_smallest_case_loses_the_largest_value_and_the_lifted_limit_keeps_it():
    case = port.smallest_case()
    stock = judged(case)
    assert stock.verdict == Verdict.FAIL_MISSING and stock.wrong_tokens == (1,), stock.headline()
    indices = port.fast_topk(case)[0]
    assert 4096 not in indices.tolist() and 3584 in indices.tolist()  # the row's largest out, the 513th in
    assert judged(case, None).verdict == Verdict.PASS


@pytest.mark.parametrize("case", [port.smallest_case(reverse=True), TopkCase(
    name="fast-topk-4096-increasing", storage=(1.0 + torch.arange(4096, dtype=torch.float32) * 2.0 ** -16)[None],
    width=4096, starts=torch.tensor([0]), ends=torch.tensor([4096]), k=512)], ids=lambda case: case.name)
def test_the_same_values_pass_when_the_dropped_candidate_is_not_needed_or_none_is_dropped(case):
    assert judged(case).verdict == Verdict.PASS


def test_port_returns_what_the_h200_returned_on_the_crowded_bin_cases():
    """difftest run --op topk --device cuda on one H200 (sglang-jit-fast-topk, 2026-12-04): 2049 PASS; 4097
    FAIL(missing), 1 token, first 'row 0 slot 2047: ... index 1681 (value 1.11901) ... k-th value 1.11906';
    16385 FAIL(missing), 1523 tokens, k-th value 1.21422, column 416 holding 1.1837."""
    specs = port.crowded_specs()
    cases = {name: port.gpu_case(specs[name], 0) for name in ("crowded-bin-2049", "crowded-bin-4097",
                                                             "crowded-bin-16385")}
    assert judged(cases["crowded-bin-2049"]).verdict == Verdict.PASS
    missed_one = judged(cases["crowded-bin-4097"])
    assert missed_one.verdict == Verdict.FAIL_MISSING and missed_one.wrong_tokens == (1,)
    assert missed_one.first_mismatch.describe() == ("row 0 slot 2047: FAIL(missing): index 1681 (value 1.11901); "
                                                    "window [0, 4097), k-th value 1.11906")
    wide = cases["crowded-bin-16385"]
    missed_many = judged(wide)
    assert missed_many.verdict == Verdict.FAIL_MISSING and missed_many.wrong_tokens == (1523,)
    assert (f"{missed_many.first_mismatch.kth:g}", f"{float(wide.logits[0, 416]):g}") == ("1.21422", "1.1837")
    assert all(judged(case, None).verdict == Verdict.PASS for case in cases.values())


@pytest.mark.parametrize("values", [TopkValues.NORMAL, TopkValues.INTEGER, TopkValues.CROWDED, TopkValues.HEAVY,
                                    TopkValues.EQUAL])
@pytest.mark.parametrize("k", port.KS)
def test_lifted_port_is_exact_and_the_stock_port_fails_only_past_the_list(values, k):
    """Rows of 2k + 1, 4096 and 9000 columns: ties (integer, all-equal), one crowded bin, many binades. A
    row goes wrong only where its coarse threshold bin holds more than 4096 candidates."""
    case = build_topk_case(TopkSpec(name=f"port-{values.value}", rows=3, width=9000, k=k, values=values,
                                    windows=WindowDist.FULL, starts=(0, 0, 0), ends=(2 * k + 1, 4096, 9000)), 7)
    assert judged(case, None).verdict == Verdict.PASS, judged(case, None).headline()
    logits = case.logits.numpy()
    overflowing = {row for row in range(case.rows)
                   if port.fast_topk_row(logits[row, :int(case.ends[row])], k).coarse_population > port.STASH_ENTRIES}
    assert set(judged(case).wrong_rows) <= overflowing
    assert 1 not in overflowing  # 4096 columns: the list holds the whole bin


def test_missing_tokens_follow_the_population_past_the_list():
    assert port.missing_by_population(512, 4096, rows=2) == (0.0, 0.0)
    mean, expected = port.missing_by_population(512, 8192, rows=4)
    assert expected == 256 and abs(mean - expected) < 40


def test_coarse_bin_is_the_top_byte_of_the_ordered_fp16_key():
    values = np.array([1.0, 1.2451, 1.25, -1.0, 0.0, 70000.0], dtype=np.float32)
    assert port.coarse_bin(values).tolist() == [0xBC, 0xBC, 0xBD, 0x43, 0x80, 0xFC]
