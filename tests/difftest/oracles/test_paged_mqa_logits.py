"""The oracle against the golden files, against a slow per-element loop, and its float32 bound."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from difftest.core.case import Case
from difftest.generators import LengthDist, build_case
from difftest.oracles.paged_mqa_logits import fp32_error_bound, paged_mqa_logits, reference
from tests.support import TINY_SPECS, assert_same_logits, golden_params, slow_reference

SEEDS = range(18)  # 18 tiny specs x 18 seeds = 324 cases


def _golden(path) -> tuple[Case, torch.Tensor, dict]:
    with np.load(path) as z:
        expected = torch.from_numpy(z["expected"].copy())
        meta = json.loads(str(z["meta"]))
    return Case.load(path), expected, meta


def _as_tensor(values: dict, rows: int, positions: int) -> torch.Tensor:
    return torch.tensor([[values[r, p] for p in range(positions)] for r in range(rows)], dtype=torch.float64)


# --------------------------------------------------------------------------- golden files

@pytest.mark.parametrize("path", golden_params())
def test_reference_reproduces_golden(path):
    case, expected, meta = _golden(path)
    got = reference(case)
    assert got.dtype == torch.float64, f"{got.dtype=}"
    assert tuple(got.shape) == tuple(expected.shape), f"{meta['name']}: {tuple(got.shape)=} {tuple(expected.shape)=}"
    differ = torch.nonzero(torch.isneginf(got) != torch.isneginf(expected))[:4].tolist()
    assert not differ, f"{meta['name']}: -inf pattern differs at (row, pos) {differ}"
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(got)), f"{meta['name']}: finite pattern differs"
    if finite.any():
        scale = float(expected[finite].abs().max())
        rel = float((got - expected)[finite].abs().max()) / scale
        assert rel <= 1e-12, f"{meta['name']}: {rel=} > 1e-12 ({scale=})"


@pytest.mark.parametrize("path", golden_params())
def test_slow_reference_reproduces_golden(path):
    """The loop reference the random cases are checked against is itself right (on a subset for the big file)."""
    case, expected, meta = _golden(path)
    big = case.heads * case.head_dim * case.max_model_len * case.rows > 500_000
    positions = [*list(range(0, case.max_model_len, 7)), case.max_model_len - 1] if big else None
    slow = slow_reference(case, positions=positions)
    for (row, pos), value in slow.items():
        want = float(expected[row, pos])
        if math.isinf(want):
            assert value == want, f"{meta['name']}: {row=}, {pos=}: {value=} {want=}"
        else:
            assert abs(value - want) <= 1e-12 * max(1.0, abs(want)), f"{meta['name']}: {row=}, {pos=}: {value=} {want=}"


# --------------------------------------------------------------------------- slow loop, many cases

@pytest.mark.parametrize("spec", TINY_SPECS, ids=lambda s: s.name)
def test_reference_matches_slow_loop(spec):
    for seed in SEEDS:
        case = build_case(spec, seed)
        got = reference(case)
        want = _as_tensor(slow_reference(case), case.rows, case.max_model_len)
        assert_same_logits(got, want, rel=1e-12, what=f"{spec.name} {seed=} {case.describe()}")


def test_slow_loop_cases_reach_the_edges():
    """The cases above really contain the edges they are meant to cover."""
    seen: set[str] = set()
    for spec in TINY_SPECS:
        for seed in SEEDS:
            case = build_case(spec, seed)
            lens, n, bs = case.seq_lens.tolist(), case.next_n, case.block_size
            seen |= {"L=0"} if 0 in lens else set()
            seen |= {"L=1"} if 1 in lens else set()
            seen |= {"0<L<next_n"} if any(0 < x < n for x in lens) else set()
            seen |= {"L=max_model_len"} if case.max_model_len in lens else set()
            seen |= {f"L%bs={d}" for x in lens for d in (-1, 0, 1) if bs > 2 and x > 1 and (x - d) % bs == 0}
            seen |= {"padding"} if spec.padding and lens[-spec.padding:] == [0] * spec.padding else set()
            seen |= {"fnuz"} if case.fp8.value == "e4m3fnuz" else set()
    wanted = {"L=0", "L=1", "0<L<next_n", "L=max_model_len", "L%bs=-1", "L%bs=0", "L%bs=1", "padding", "fnuz"}
    assert wanted <= seen, f"{wanted - seen=}"


def test_reference_ignores_nan_canaries_outside_the_window():
    """Stale and past-end slots hold NaN keys; none may leak into any row."""
    spec = next(s for s in TINY_SPECS if s.name == "stale-canary-overhang")
    for seed in range(5):
        case = build_case(spec, seed)
        assert torch.isnan(case.k_values()).any(), f"{seed=}: the case has no canary to ignore"
        got = reference(case)
        nan_rows = torch.nonzero(torch.isnan(got).any(1)).flatten().tolist()
        assert not nan_rows, f"{seed=}: {nan_rows=}"


def test_reference_rows_past_max_model_len_are_clamped():
    """paged_mqa_logits with limits past max_model_len writes max_model_len columns, no error."""
    case = build_case(TINY_SPECS[0].replace(length_dist=LengthDist.FULL), 0)
    lens = case.row_lens() + 5
    out = paged_mqa_logits(case.q_values(), case.k_values(), case.scale_pool, case.weights,
                           torch.cat([case.block_table, case.block_table], dim=1), lens, case.max_model_len)
    assert tuple(out.shape) == (case.rows, case.max_model_len), f"{tuple(out.shape)=}"
    assert torch.isfinite(out).all(), "every position is inside a window that long"


# --------------------------------------------------------------------------- float32 bound

@pytest.mark.parametrize("spec", TINY_SPECS, ids=lambda s: s.name)
def test_float32_evaluation_within_fp32_error_bound(spec):
    for seed in range(4):
        case = build_case(spec.replace(heads=8, head_dim=64), seed)
        exact = reference(case)
        single = reference(case, dtype=torch.float32)
        assert single.dtype == torch.float32, f"{single.dtype=}"
        bound = fp32_error_bound(case.q_values(), case.k_values(), case.scale_pool, case.weights,
                                 case.block_table, case.row_lens())
        assert tuple(bound.shape) == (case.rows,), f"{tuple(bound.shape)=}"
        assert torch.isfinite(bound).all() and (bound >= 0).all(), f"{bound=}"
        assert torch.equal(torch.isneginf(single), torch.isneginf(exact)), f"{spec.name} {seed=}: -inf pattern"
        err = torch.where(torch.isfinite(exact), (single.double() - exact).abs(), 0.0).amax(dim=1)
        over = torch.nonzero(err > bound.double()).flatten().tolist()
        assert not over, f"{spec.name} {seed=}, rows {over}: err={err[over].tolist()} > bound={bound[over].tolist()}"


def test_fp32_error_bound_is_not_vacuous():
    """The bound is zero for empty rows and small (well under the row's values) for filled ones."""
    case = build_case(TINY_SPECS[0].replace(lengths=(0, 20), heads=8, head_dim=64), 0)
    bound = fp32_error_bound(case.q_values(), case.k_values(), case.scale_pool, case.weights,
                             case.block_table, case.row_lens())
    scale = reference(case)[1].abs().max()
    assert bound[0] == 0, f"{bound=}"
    assert 0 < bound[1] < 1e-4 * scale, f"{bound=}, {scale=}"
