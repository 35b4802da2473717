"""The top-k backends called directly on generated cases: the torch references (CPU) and FlagGems'
bucket_sort_topk under the Triton interpreter, with their declared conventions and what they get wrong."""

from __future__ import annotations

import warnings

import pytest
import torch

from difftest.backends import flaggems_topk, torch_topk
from difftest.core.kinds import IndexConvention, TopkPadding
from difftest.core.topk import TopkCase, encode_topk
from difftest.core.verdict import Verdict
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.envelope import Target
from difftest.generators.topk import TopkPlanned, TopkSpec, TopkValues, WindowDist, build_topk_case, topk_plan
from difftest.oracles.topk import reference

FLAGGEMS = flaggems_topk.FlagGemsBucketTopk()
FLAGGEMS_MISSING = FLAGGEMS.unavailable_reason("cpu")


def _judge(backend, case):
    got = backend(encode_topk(case, backend.contract), None)
    return compare_topk(reference(case, backend.contract.nan), got, case, backend.contract), got


def _plan(backend, names):
    return [p.spec for p in topk_plan(backend.contract, Target.small_cpu())
            if isinstance(p, TopkPlanned) and p.spec.name in names]


def test_torch_topk_passes_every_family_it_takes():
    backend = torch_topk.TorchTopk()
    specs = [p.spec for p in topk_plan(backend.contract, Target.small_cpu()) if isinstance(p, TopkPlanned)]
    assert len(specs) >= 20
    for spec in specs:
        result, got = _judge(backend, build_topk_case(spec, 0))
        assert result.verdict == Verdict.PASS, (spec.name, result.headline())
        assert got.dtype == torch.int32


def test_the_two_torch_references_pad_differently():
    case = build_topk_case(TopkSpec(rows=3, width=24, k=8, starts=(0,) * 3, ends=(16,) * 3, finite=(5, 8, 12)), 0)
    sglang, vllm = torch_topk.TorchTopk(), torch_topk.VllmTorchTopk()
    pads = (sglang(encode_topk(case, sglang.contract), None) == -1).sum(dim=1).tolist()
    assert pads == [3, 0, 0], pads  # -1 past the candidates
    assert (vllm(encode_topk(case, vllm.contract), None) == -1).sum().item() == 0  # -1 only past the window


def test_vllm_torch_reference_returns_out_of_window_indices_when_a_window_holds_few_candidates():
    """docs/findings/vllm-torch-topk-out-of-window.md: its -inf picks come from anywhere in the row."""
    backend = torch_topk.VllmTorchTopk()
    case = build_topk_case(_plan(backend, {"few-candidates"})[0], 0)
    result, _ = _judge(backend, case)
    assert result.verdict == Verdict.FAIL_OUT_OF_WINDOW and result.wrong_rows == (0,), result.headline()


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_conventions_are_as_declared():
    contract = FLAGGEMS.contract
    assert contract.index == IndexConvention.ABSOLUTE and contract.padding == TopkPadding.OUTSIDE_COLUMNS
    case = build_topk_case(TopkSpec(rows=3, width=64, k=8, starts=(10, 0, 5), ends=(40, 4, 64)), 1)
    result, got = _judge(FLAGGEMS, case)
    assert result.verdict == Verdict.PASS, result.headline()
    assert ((got[0] >= 10) & (got[0] < 40)).all(), got[0]  # absolute columns of the window [10, 40)
    assert (got[1] != -1).all() and ((got[1] >= 4).sum() == 4), got[1]  # no -1: 4 fills outside [0, 4)


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_passes_its_families_without_exact_ties():
    names = {"random-k512", "few-candidates", "short-windows", "nan-inside", "neg-inf-and-pos-inf", "decode-mtp2",
             "odd-width"}
    specs = _plan(FLAGGEMS, names)
    assert {s.name for s in specs} == names
    for spec in specs:
        result, _ = _judge(FLAGGEMS, build_topk_case(spec, 0))
        assert result.verdict == Verdict.PASS, (spec.name, result.headline())


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_writes_past_its_candidate_list_when_a_bin_holds_more_than_4096():
    """docs/findings/flaggems-bucket-topk-candidate-overflow.md: 4097 values of one bin, one row."""
    case = build_topk_case(TopkSpec(rows=1, width=4100, k=2048, starts=(0,), ends=(4097,),
                                    values=TopkValues.CROWDED), 0)
    with pytest.warns(flaggems_topk.OutOfBoundsWrite, match="1 candidate ids past"):
        _judge(FLAGGEMS, case)
    assert FLAGGEMS.last_out_of_bounds == 1
    fits = build_topk_case(TopkSpec(rows=1, width=4096, k=2048, windows=WindowDist.FULL, values=TopkValues.CROWDED), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", flaggems_topk.OutOfBoundsWrite)
        assert _judge(FLAGGEMS, fits)[0].verdict == Verdict.PASS and FLAGGEMS.last_out_of_bounds == 0


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_returns_minus_one_where_padding_lanes_tie_with_candidates():
    """docs/findings/flaggems-bucket-topk-padding-lanes.md: 2 rows x 2 columns, k 1. Row 1's two equal values
    leave padding lanes (index -1, value 0.0) tied with them in the third round; the fourth reads their value
    at inputs[1 * S - 1], row 0's last logit, whose low key byte ranks above, and emits index -1."""
    storage = torch.tensor([[0.0, 1.0000001], [1.0, 1.0]])
    case = TopkCase("padding-lanes", storage, 2, torch.tensor([0, 0]), torch.tensor([2, 2]), 1).validate()
    result, got = _judge(FLAGGEMS, case)
    assert got.tolist() == [[1], [-1]] and result.rows_by_verdict == {Verdict.FAIL_PADDING: (1,)}, got
    storage[0, 1] = 2.0  # a low key byte of 0: the -1 lanes stay below the threshold
    assert _judge(FLAGGEMS, case)[0].verdict == Verdict.PASS
    for spec in _plan(FLAGGEMS, {"all-equal", "ties-straddle"}):  # exact ties: found unaided by the families
        assert _judge(FLAGGEMS, build_topk_case(spec, 0))[0].verdict == Verdict.FAIL_PADDING, spec.name


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_refuses_strided_rows_it_would_misread():
    case = build_topk_case(TopkSpec(rows=2, width=64, row_stride=96, k=8, windows=WindowDist.FULL), 0)
    assert "differs from width" in FLAGGEMS.contract.accepts(case, "cpu")


def test_unavailable_reasons_name_the_cause(monkeypatch):
    monkeypatch.setattr(flaggems_topk, "kernel_file", lambda: None)
    assert "flag-gems==5.0.2" in flaggems_topk.FlagGemsBucketTopk().unavailable_reason("cpu")
    assert torch_topk.TorchTopk().unavailable_reason("cpu") is None
