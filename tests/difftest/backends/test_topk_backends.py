"""The top-k backends called directly on generated cases: the torch references (CPU) and FlagGems'
bucket_sort_topk under the Triton interpreter, with their declared conventions and what they get wrong."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from difftest.backends import flaggems_topk, torch_topk
from difftest.core.kinds import IndexConvention, TopkPadding
from difftest.core.topk import TopkCase, encode_topk
from difftest.core.triton_interpret import Landing
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
def test_flaggems_guard_holds_what_a_row_lists_with_the_largest_block(monkeypatch):
    """The first pass lists every lane of a row's blocks outside its window, those past the width too. At BS 8192
    (a config the GPU's autotuner runs on the first call of a (width, k)) a window of 402 columns in a row of
    1536 lists 8192 - 402 = 7790 candidates: 3694 past the row's 4096. A guard of `width` slots saturated at 1536
    on the H200 (random-k512, 2026-12-04) and let the rest land in whatever memory followed."""
    kernel = getattr(flaggems_topk.load_kernels(interpret=True), flaggems_topk.KERNEL)
    assert flaggems_topk.LARGEST_BS == max(config.kwargs["BS"] for config in kernel.configs)
    monkeypatch.setattr(flaggems_topk, "CPU_CONFIG", {"BS": 8192, "BSS": 1024})
    case = build_topk_case(TopkSpec(rows=1, width=1536, k=512, starts=(318,), ends=(720,)), 0)
    with pytest.warns(flaggems_topk.OutOfBoundsWrite, match="3694 candidate ids past"):
        result, _ = _judge(FLAGGEMS, case)
    assert FLAGGEMS.last_out_of_bounds == 3694 and result.verdict == Verdict.PASS, result.headline()


def _overflowing_pair(victim: list[float], victim_window: tuple[int, int], k: int) -> TopkCase:
    """Two rows of 4099 columns. Row 0's window is [0, 1): its other lanes (5119 at the CPU's BS 1024, at least
    4127 at any BS) are its threshold bin, listed in lane order, so lanes 4097, 4098, ... land on row 1's list
    positions 0, 1, ... Row 0 needs nothing past its one value, so it never reads them back."""
    width = len(victim)
    storage = torch.full((2, width), -math.inf)
    storage[0, 0], storage[1] = 0.0, torch.tensor(victim)
    return TopkCase("overflowing-pair", storage, width, torch.tensor([0, victim_window[0]]),
                    torch.tensor([1, victim_window[1]]), k).validate()


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_next_row_ranks_the_overflow_as_its_own_candidates_when_it_lands_late():
    """docs/findings/flaggems-bucket-topk-candidate-overflow.md, smallest case (k 1). Row 1 holds -1.0 except 1.0
    at column 10 and 1.5 at column 20: its threshold bin (top key byte 0xBF) lists [10, 20] and the rounds pick
    20. When row 0's overflow lands after row 1's first pass (the GPU schedule the interpreter emulates with
    overflow_lands_late), row 1's list reads [4097, 4098]: both -1.0, tied through the four rounds, so the final
    fill takes the first, 4097. The interpreter's own order (row 0, then row 1) gives the right answer."""
    victim = [-1.0] * 4099
    victim[10], victim[20] = 1.0, 1.5
    case = _overflowing_pair(victim, (0, 4099), k=1)
    result, got = _judge(FLAGGEMS, case)
    assert got.tolist() == [[0], [20]] and result.verdict == Verdict.PASS, got
    result, got = _judge(flaggems_topk.FlagGemsBucketTopk(overflow_lands_late=True), case)
    assert got.tolist() == [[0], [4097]] and result.rows_by_verdict == {Verdict.FAIL_MISSING: (1,)}, got


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_next_row_selects_a_column_twice_when_the_overflow_lands_late():
    """The H200's FAIL(duplicate) (random-k2048-s0, row 3 after row 2), reduced: row 1's window [0, 1) leaves
    k - 1 = 2 picks to its outside columns, which rise with the column (HOSTILE-like), so the two largest,
    4098 and 4097, are its picks. Row 0's overflow puts lanes 4097 and 4098 on row 1's list positions 0 and 1
    as well: listed twice, 4098 is picked twice."""
    victim = [1.0e30 * (1.0 + column / 8198) for column in range(4099)]
    victim[0] = 0.0
    case = _overflowing_pair(victim, (0, 1), k=3)
    with pytest.warns(flaggems_topk.OutOfBoundsWrite, match="1023 candidate ids past"):  # row 1's 5119 lanes
        assert sorted(_judge(FLAGGEMS, case)[1][1].tolist()) == [0, 4097, 4098]
    with pytest.warns(flaggems_topk.OutOfBoundsWrite, match="1023 candidate ids past"):
        result, got = _judge(flaggems_topk.FlagGemsBucketTopk(overflow_lands_late=True), case)
    assert sorted(got[1].tolist()) == [0, 4098, 4098] and result.verdict == Verdict.FAIL_DUPLICATE, got


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_row_after_a_full_row_loses_its_own_pick_when_the_overflow_lands_between_reads():
    """The H200's FAIL(out-of-window) on one-token rows (32 pairs), reduced to 3 rows of 4099, k 2. Row 0's window
    [0, 1) spills lanes 4097, 4098, ... onto row 1's list. Row 1 (full window, -1.0 but 1.0 at column 10, 1.5 at
    20, 100.0 at 4097) picks 4097 in its first pass and lists [10, 20]; its first round's histogram pass reads
    [10, 20]: nothing above their bin, one pick still needed. When row 0's ids land before the store pass reads
    the list again (Landing.REREAD), that pass finds 4097 (100.0) above the bin and stores it at slot 1, and the
    final fill stores one more, at slot 2: no count is clamped to k, so it is row 2's slot 0, where row 2 (window
    [0, 1)) had put its only column. Row 2 then holds two outside columns: FAIL(out-of-window)."""
    width = 4099
    storage = torch.full((3, width), -1.0)
    storage[1, 10], storage[1, 20], storage[1, 4097] = 1.0, 1.5, 100.0
    case = TopkCase("overflow-between-reads", storage, width, torch.tensor([0, 0, 0]), torch.tensor([1, width, 1]),
                    2).validate()
    rereading = flaggems_topk.FlagGemsBucketTopk(overflow_lands_late=True, landing=Landing.REREAD)
    for backend in (FLAGGEMS, rereading):
        with pytest.warns(flaggems_topk.OutOfBoundsWrite, match="1023 candidate ids past"):  # row 2's 5119 lanes
            result, got = _judge(backend, case)
        assert backend.last_indices_out_of_bounds == 0
        if backend is FLAGGEMS:
            assert got[1].tolist() == [4097, 20] and got[2, 0] == 0 and result.verdict == Verdict.PASS, got
    assert got[1].tolist() == [4097, 4097] and got[2, 0] == 4097, got
    assert result.rows_by_verdict == {Verdict.FAIL_DUPLICATE: (1,), Verdict.FAIL_OUT_OF_WINDOW: (2,)}, got


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


def _preceded_by(value: float):
    """The adapter's copy of the logits with `value` as the float just before row 0: what the kernel reads as
    `inputs[-1]` (memory before the buffer; on the H200, whatever the allocator left there)."""
    def guarded(logits: torch.Tensor) -> torch.Tensor:
        rows, width = logits.shape
        storage = torch.full((1 + rows * width + flaggems_topk.LOGITS_GUARD,), -math.inf, dtype=logits.dtype)
        storage[0], storage[1:1 + rows * width] = value, logits.reshape(-1)
        return storage[1:1 + rows * width].view(rows, width)
    return guarded


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_one_row_returns_minus_one_when_the_float_before_its_logits_outranks_its_ties(monkeypatch):
    """The H200's FAIL(padding) on ties-2049 (one row: 1024 values above 2049 ties of 1.0, k 2048; 1023 slots of
    -1 from slot 1024), which passes on the CPU. The padding lanes that join the ties read `inputs[-1]`, before
    the buffer: 1.0000001 there (low key byte 0x01) puts them above the ties, 0.0 (0x00) does not. The -1 count
    is the last block's padding lanes: 2304 - 2049 = 255 at the CPU's BSS 256, 3072 - 2049 = 1023 at BSS 1024."""
    spec = TopkSpec(rows=1, width=5124, k=2048, windows=WindowDist.FULL, values=TopkValues.TIED, ties=(2049,))
    case = build_topk_case(spec, 0)
    monkeypatch.setattr(flaggems_topk, "_guarded", _preceded_by(0.0))
    assert _judge(FLAGGEMS, case)[0].verdict == Verdict.PASS
    monkeypatch.setattr(flaggems_topk, "_guarded", _preceded_by(1.0000001))
    for config, padding_lanes in (({"BS": 1024, "BSS": 256}, 255), ({"BS": 8192, "BSS": 1024}, 1023)):
        monkeypatch.setattr(flaggems_topk, "CPU_CONFIG", config)
        result, got = _judge(FLAGGEMS, case)
        assert result.verdict == Verdict.FAIL_PADDING and got[0, 1024:1024 + padding_lanes].eq(-1).all(), config
        assert int(got.eq(-1).sum()) == padding_lanes, config


@pytest.mark.skipif(FLAGGEMS_MISSING is not None, reason=str(FLAGGEMS_MISSING))
def test_flaggems_refuses_strided_rows_it_would_misread():
    case = build_topk_case(TopkSpec(rows=2, width=64, row_stride=96, k=8, windows=WindowDist.FULL), 0)
    assert "differs from width" in FLAGGEMS.contract.accepts(case, "cpu")


def test_unavailable_reasons_name_the_cause(monkeypatch):
    monkeypatch.setattr(flaggems_topk, "kernel_file", lambda: None)
    assert "flag-gems==5.0.2" in flaggems_topk.FlagGemsBucketTopk().unavailable_reason("cpu")
    assert torch_topk.TorchTopk().unavailable_reason("cpu") is None
