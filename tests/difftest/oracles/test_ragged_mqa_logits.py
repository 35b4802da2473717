"""The ragged oracle against the golden files (computed without difftest), against a plain loop over keys, its
window-relative frame and the ABSOLUTE form, and its float32 bound against a float32 evaluation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from difftest.core.ragged import RaggedCase
from difftest.generators.ragged import RaggedSpec, RaggedWindows, build_ragged_case
from difftest.generators.spec import Values
from difftest.oracles.ragged_mqa_logits import absolute, error_bound, ragged_mqa_logits, reference

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden" / "ragged").glob("*.npz"))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_reference_reproduces_golden(path):
    case = RaggedCase.load(path)
    with np.load(path) as z:
        expected = torch.from_numpy(z["expected"].copy())
    got = absolute(reference(case), case.k_start, case.keys)
    assert got.dtype == torch.float64 and got.shape == expected.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected)), f"{path.stem}: -inf pattern differs"
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(got)), f"{path.stem}: a canary leaked"
    rel = float((got - expected)[finite].abs().max() / expected[finite].abs().max())
    assert rel <= 1e-12, f"{path.stem}: {rel=}"


def test_golden_files_exist():
    assert len(GOLDEN) == 4, f"expected the four golden cases in tests/golden/ragged, found {GOLDEN}"


def _loop(case: RaggedCase) -> torch.Tensor:
    """float64 [rows, keys] by the formula, one key at a time."""
    q, k = case.q_values(), case.k_values()
    out = torch.full((case.rows, case.keys), -math.inf, dtype=torch.float64)
    for row, (start, end) in enumerate(zip(case.k_start.tolist(), case.k_end.tolist(), strict=True)):
        for key in range(start, end):
            heads = (q[row] @ k[key]).relu() * case.weights[row].double()
            out[row, key] = heads.sum() * float(case.k_scale[key])
    return out


@pytest.mark.parametrize("spec", [
    RaggedSpec(rows=5, keys=60, heads=4, head_dim=16),
    RaggedSpec(rows=7, keys=50, heads=3, head_dim=32, windows=RaggedWindows.STAIRCASE, requests=3,
               values=Values.HEAVY),
    RaggedSpec(rows=3, keys=20, heads=2, head_dim=16, starts=(0, 19, 7), ends=(0, 20, 15), max_seqlen_k=11),
], ids=["random", "staircase-heavy", "explicit"])
def test_reference_is_the_formula_in_the_window_relative_frame(spec):
    case = build_ragged_case(spec, 1)
    loop = _loop(case)
    relative = reference(case)
    assert relative.shape == (case.rows, case.seqlen_k)
    lens = case.window_lens()
    for row in range(case.rows):
        start, n = int(case.k_start[row]), int(lens[row])
        assert torch.allclose(relative[row, :n], loop[row, start:start + n], rtol=1e-13, atol=0)
        assert torch.isneginf(relative[row, n:]).all(), row
    assert torch.equal(torch.isneginf(absolute(relative, case.k_start, case.keys)), torch.isneginf(loop))


def test_a_narrower_frame_keeps_each_windows_first_columns():
    case = build_ragged_case(RaggedSpec(rows=4, keys=40, heads=2, head_dim=16, windows=RaggedWindows.FULL), 0)
    assert torch.equal(reference(case, width=7), reference(case)[:, :7])


def test_float32_evaluation_stays_inside_the_bound():
    for values in Values:
        case = build_ragged_case(RaggedSpec(rows=6, keys=80, heads=16, head_dim=64, values=values), 2)
        exact = reference(case)
        single = ragged_mqa_logits(case.q_values(torch.float32), case.k.view(case.fp8.dtype), case.k_scale,
                                   case.weights, case.k_start, case.k_end, case.seqlen_k).double()
        bound = error_bound(case)
        finite = torch.isfinite(exact)
        errors = torch.where(finite, (single - exact).abs(), 0.0).amax(dim=1)
        assert bool((errors <= bound).all()), f"{values}: {errors=} {bound=}"
        assert bool((bound[case.window_lens() == 0] == 0).all())
