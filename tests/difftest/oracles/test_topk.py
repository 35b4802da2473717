"""The top-k oracle against the golden files (computed without difftest), against a plain-Python count on
drawn cases, and one_answer judged right by the comparison."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from difftest.core.kinds import IndexConvention, NanRanking, TopkPadding, WindowForm
from difftest.core.topk import TopkCase, TopkContract
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.topk import TopkSpec, TopkValues, WindowDist, build_topk_case
from difftest.oracles.topk import one_answer, reference

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden" / "topk").glob("*.npz"))


def test_there_are_golden_files():
    assert len(GOLDEN) >= 7, GOLDEN


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_oracle_reproduces_golden(path):
    case = TopkCase.load(path)
    truth = reference(case, NanRanking(case.meta["nan"]))
    with np.load(path) as z:
        for field in ("above", "equal", "candidates", "nans"):
            assert getattr(truth, field).tolist() == z[f"expected_{field}"].tolist(), (path.stem, field)
        assert np.array_equal(truth.kth_values().numpy(), z["expected_kth"], equal_nan=True), path.stem


def _plain_truth(values: list[float], k: int) -> tuple[float, int, int, int]:
    """(kth, above, equal, candidates) of one window, NaN ranked highest, counted in plain Python."""
    keys = sorted(((1, 0.0) if math.isnan(v) else (0, v) for v in values if v != -math.inf), reverse=True)
    need = min(k, len(keys))
    if not need:
        return -math.inf, 0, 0, len(keys)
    kth = keys[need - 1]
    return (math.nan if kth[0] else kth[1], sum(key > kth for key in keys), sum(key == kth for key in keys),
            len(keys))


@pytest.mark.parametrize("values", list(TopkValues))
def test_oracle_matches_a_plain_count(values):
    spec = TopkSpec(rows=6, width=50, k=7, values=values, ties=(3, 7, 20), windows=WindowDist.RAGGED, finite=(5, 40),
                    nans=1, pos_infs=1)
    for seed in range(3):
        case = build_topk_case(spec, seed)
        truth = reference(case)
        for row in range(case.rows):
            window = case.logits[row, int(case.starts[row]):int(case.ends[row])].double().tolist()
            kth, above, equal, candidates = _plain_truth(window, case.k)
            got = (float(truth.kth_values()[row]), int(truth.above[row]), int(truth.equal[row]),
                   int(truth.candidates[row]))
            assert got[1:] == (above, equal, candidates), (values, seed, row, got, (kth, above, equal, candidates))
            assert got[0] == kth or (math.isnan(got[0]) and math.isnan(kth)), (values, seed, row, got, kth)


@pytest.mark.parametrize("values", list(TopkValues))
def test_one_answer_is_right(values):
    contract = TopkContract(IndexConvention.ROW_RELATIVE, TopkPadding.PAST_CANDIDATES, WindowForm.STARTS_ENDS,
                            sorted=True, nan=NanRanking.HIGHEST)
    case = build_topk_case(TopkSpec(rows=5, width=40, k=9, values=values, ties=(8, 9, 30), finite=(4, 30),
                                    nans=1), 1)
    result = compare_topk(reference(case), one_answer(case), case, contract)
    assert result.verdict.value == "PASS", result.headline()


def test_a_row_narrower_than_k_is_padded():
    case = build_topk_case(TopkSpec(rows=2, width=5, k=8, windows=WindowDist.FULL), 0)
    answer = one_answer(case)
    assert answer.shape == (2, 8) and (answer[:, 5:] == -1).all(), answer
    assert torch.equal(reference(case).need, torch.tensor([5, 5]))


def test_topk_within_ranks_the_candidates_near_the_kth_value_as_ties_and_no_others():
    from difftest.oracles.topk import topk_within

    logits = torch.tensor([[4.0, 2.0, 2.0 + 1e-7, 1.0, 2.0 - 1e-3, -math.inf]], dtype=torch.float64)
    starts, ends = torch.tensor([0]), torch.tensor([6])
    ranked, truth = topk_within(logits, starts, ends, 2, torch.tensor([1e-6]))
    assert ranked[0, 1] == ranked[0, 2] == 2.0 + 1e-7 and ranked[0, 4] == 2.0 - 1e-3  # 1e-3 off: not near
    assert truth.above.tolist() == [1] and truth.equal.tolist() == [2]  # 4.0, then either near-tie
    _, exact = topk_within(logits, starts, ends, 2, torch.tensor([0.0]))
    assert exact.equal.tolist() == [1]  # no tolerance: only 2.0 + 1e-7 is the second


def _one_row(values: list[float], k: int) -> TopkCase:
    logits = torch.tensor([values], dtype=torch.float32)
    return TopkCase(name="row", storage=logits, width=len(values), starts=torch.tensor([0]),
                    ends=torch.tensor([len(values)]), k=k).validate()


def test_the_values_real_kernels_meet_each_have_one_right_answer():
    """+inf above the largest finite float32, a denormal above 0.0 (no flush to zero), -0.0 equal to 0.0, +inf
    tied at the k-th, a row of all -inf with no candidate."""
    biggest, denormal = float(torch.finfo(torch.float32).max), 2.0 ** -140
    truth = reference(_one_row([biggest, math.inf, 1.0], 1))
    assert float(truth.kth_values()[0]) == math.inf and int(truth.equal[0]) == 1
    truth = reference(_one_row([0.0, denormal, -0.0, -denormal], 2))
    assert float(truth.kth_values()[0]) == 0.0 and (int(truth.above[0]), int(truth.equal[0])) == (1, 2)
    truth = reference(_one_row([math.inf, 2.0, math.inf, math.inf], 2))
    assert float(truth.kth_values()[0]) == math.inf and (int(truth.above[0]), int(truth.equal[0])) == (0, 3)
    truth = reference(_one_row([-math.inf] * 4, 2))
    assert (int(truth.candidates[0]), int(truth.need[0]), float(truth.kth_values()[0])) == (0, 0, -math.inf)
