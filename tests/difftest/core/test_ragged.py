"""RaggedCase (validation naming the field, .npz round trip, hostile archives), RaggedContract (accepts, the
window-relative form's bound on windows), RaggedTiles, and encode_ragged."""

from __future__ import annotations

import dataclasses
import zipfile

import numpy as np
import pytest
import torch

from difftest.core.errors import SpecError
from difftest.core.kinds import Fp8Flavour, LogitsForm, MaskConvention
from difftest.core.ragged import RaggedCase, RaggedContract, RaggedTiles, covered_keys, encode_ragged


def _case(starts: list[int] | None = None, ends: list[int] | None = None, keys: int = 12, heads: int = 2,
          max_seqlen_k: int | None = None) -> RaggedCase:
    starts, ends = starts or [0, 3, 5], ends or [4, 3, 12]
    rows = len(starts)
    gen = torch.Generator().manual_seed(0)
    fp8 = lambda *shape: torch.randn(*shape, generator=gen).to(torch.float8_e4m3fn).view(torch.uint8)  # noqa: E731
    return RaggedCase("t", fp8(rows, heads, 16), fp8(keys, 16), torch.ones(keys), torch.ones(rows, heads),
                      torch.tensor(starts), torch.tensor(ends), max_seqlen_k).validate()


@pytest.mark.parametrize(("change", "field"), [
    (dict(k_start=torch.tensor([0, 4, 5]), k_end=torch.tensor([4, 3, 12])), "k_start, k_end"),
    (dict(k_end=torch.tensor([4, 3, 13])), "k_start, k_end"),
    (dict(k_start=torch.tensor([0, 3, 5], dtype=torch.int32)), "k_start.dtype"),
    (dict(k_end=torch.tensor([4, 3])), "k_end.shape"),
    (dict(k_scale=torch.ones(11)), "k_scale.shape"),
    (dict(weights=torch.ones(3, 2, dtype=torch.float64)), "weights.dtype"),
    (dict(weights=torch.tensor([[1.0, float("inf")]] * 3)), "weights"),
    (dict(q=torch.zeros(3, 2, 24, dtype=torch.uint8)), "D"),
    (dict(max_seqlen_k=0), "max_seqlen_k"),
    (dict(fp8="e4m3fn"), "fp8"),
    (dict(name=3), "name"),
])
def test_validate_names_the_field(change, field):
    with pytest.raises(SpecError) as info:
        dataclasses.replace(_case(), **change).validate()
    assert info.value.field == field, info.value
    assert "\n" not in str(info.value)


def test_keys_a_window_holds_need_finite_positive_scales_and_no_nan_bytes_the_others_may_be_canaries():
    case = _case(starts=[0, 6], ends=[4, 12])  # keys 4 and 5 no window holds
    canaries = case.k.clone()
    canaries[4:6] = 0x7F
    scales = case.k_scale.clone()
    scales[4:6] = float("nan")
    dataclasses.replace(case, k=canaries, k_scale=scales).validate()
    with pytest.raises(SpecError, match="k_scale"):
        dataclasses.replace(case, k_scale=torch.where(torch.arange(12) == 7, -1.0, 1.0)).validate()
    nan_key = torch.where(torch.arange(12)[:, None] == 3, 0xFF, case.k).to(torch.uint8)
    with pytest.raises(SpecError) as info:
        dataclasses.replace(case, k=nan_key).validate()
    assert info.value.field == "k" and info.value.value == [3], info.value


def test_covered_keys_and_window_facts():
    assert covered_keys(torch.tensor([0, 3, 7]), torch.tensor([2, 3, 9]), 10).tolist() == \
        [True, True, False, False, False, False, False, True, True, False]
    case = _case()
    assert case.window_lens().tolist() == [4, 0, 7] and case.longest == 7 and case.seqlen_k == 7
    assert _case(max_seqlen_k=20).seqlen_k == 20 and _case(starts=[2], ends=[2]).seqlen_k == 1
    assert "windows=[0,4) [3,3) [5,12)" in case.describe() and repr(case).startswith("RaggedCase('t'")


def test_save_load_round_trip(tmp_path):
    case = dataclasses.replace(_case(max_seqlen_k=9), meta={"seed": 3}, fp8=Fp8Flavour.E4M3FNUZ)
    back = RaggedCase.load(case.save(tmp_path / "c.npz"))
    for field in ("q", "k", "k_scale", "weights", "k_start", "k_end"):
        assert torch.equal(getattr(back, field), getattr(case, field)), field
    assert (back.max_seqlen_k, back.fp8, back.meta, back.name) == (9, Fp8Flavour.E4M3FNUZ, {"seed": 3}, "t")


def test_load_refuses_a_member_larger_than_the_meta_says_and_what_is_no_archive(tmp_path):
    path = _case().save(tmp_path / "c.npz")
    with np.load(path) as z:
        arrays = dict(z)
    arrays["k"] = np.zeros((10_000, 16), dtype=np.uint8)
    np.savez(tmp_path / "big.npz", **arrays)
    with pytest.raises(SpecError, match="k"):
        RaggedCase.load(tmp_path / "big.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(SpecError, match="ragged case archive"):
        RaggedCase.load(tmp_path / "junk.npz")
    with zipfile.ZipFile(tmp_path / "nometa.npz", "w") as archive:
        archive.writestr("q.npy", b"")
    with pytest.raises(SpecError, match="meta"):
        RaggedCase.load(tmp_path / "nometa.npz")


def test_tiles_give_the_q_block():
    assert RaggedTiles(q_head_rows=128).block_q(64) == 2 and RaggedTiles(q_head_rows=128).block_q(32) == 4
    assert RaggedTiles(q_rows=3).block_q(64) == 3 and RaggedTiles().block_q(64) is None


def test_contract_accepts_and_the_window_relative_form_bounds_the_windows():
    relative = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_UNSPECIFIED, heads=(2,),
                              head_dims=(16, 32), max_keys=12)
    assert relative.accepts(_case(), "cpu") is None and relative.width(_case()) == 7
    assert "longer than max_seqlen_k = 5" in relative.accepts(_case(max_seqlen_k=5), "cpu")
    assert "heads [2] excludes 4" in relative.accepts(_case(heads=4), "cpu")
    assert "keys=13 exceeds" in relative.accepts(_case(keys=13), "cpu")
    assert "devices" in dataclasses.replace(relative, devices=("cuda",)).accepts(_case(), "cpu")
    absolute = RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF, powers_of_two=True)
    assert absolute.accepts(_case(max_seqlen_k=5), "cpu") is None and absolute.width(_case()) == 12
    assert "powers of two" in absolute.shape_reason(3, 12, 3, 16)


def test_encode_hands_int32_windows_the_contract_flavour_and_max_seqlen_k_where_the_form_needs_it():
    case = _case(max_seqlen_k=9)
    relative = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_UNSPECIFIED, fp8=Fp8Flavour.E4M3FNUZ)
    inputs = encode_ragged(case, relative)
    assert inputs.k_start.dtype == torch.int32 and inputs.k_end.tolist() == [4, 3, 12]
    assert inputs.q.dtype == torch.float8_e4m3fnuz and (inputs.max_seqlen_k, inputs.width) == (9, 9)
    assert torch.equal(inputs.q.float(), case.q_values(torch.float32)), "the flavour changes bytes, not values"
    absolute = encode_ragged(case, RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF))
    assert absolute.max_seqlen_k is None and absolute.width == 12 and absolute.q.dtype == torch.float8_e4m3fn
    with pytest.raises(SpecError, match="longer than max_seqlen_k"):
        encode_ragged(_case(max_seqlen_k=5), relative)
