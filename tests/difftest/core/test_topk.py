"""TopkCase (validation, .npz round trip, hostile archives), TopkContract.accepts, and encode_topk's window forms."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from difftest.core.errors import SpecError
from difftest.core.kinds import IndexConvention, RowStride, TopkPadding, WindowForm
from difftest.core.topk import TopkCase, TopkContract, decode_ends, decode_seq_lens, encode_topk


def _case(rows: int = 4, width: int = 10, stride: int | None = None, k: int = 3, next_n: int = 1,
          starts: list[int] | None = None, ends: list[int] | None = None) -> TopkCase:
    storage = torch.arange(rows * (stride or width), dtype=torch.float32).reshape(rows, stride or width)
    starts_t = torch.tensor(starts or [0] * rows)
    ends_t = torch.tensor(ends or [width] * rows)
    return TopkCase("t", storage, width, starts_t, ends_t, k, next_n).validate()


def _contract(window: WindowForm = WindowForm.STARTS_ENDS, **changes) -> TopkContract:
    return TopkContract(IndexConvention.ROW_RELATIVE, TopkPadding.PAST_CANDIDATES, window, **changes)


@pytest.mark.parametrize(("change", "field"), [
    (dict(width=11), "width"), (dict(k=0), "k"), (dict(next_n=3), "next_n"),
    (dict(starts=torch.tensor([0, 0, 5, 0]), ends=torch.tensor([10, 10, 4, 10])), "starts, ends"),
    (dict(ends=torch.tensor([10, 10, 10, 11])), "starts, ends"), (dict(starts=torch.zeros(4, dtype=torch.int32)),
                                                                  "starts.dtype"),
    (dict(storage=torch.zeros(4, 10, dtype=torch.float64)), "storage.dtype"),
])
def test_validate_names_the_field(change, field):
    with pytest.raises(SpecError) as info:
        dataclasses.replace(_case(), **change).validate()
    assert info.value.field == field, info.value


def test_a_strided_view_is_storage_and_width():
    case = _case(width=10, stride=13)
    assert case.logits.stride() == (13, 1) and case.logits.shape == (4, 10), case.logits.stride()
    assert "row_stride=13" in case.describe()


def test_save_load_round_trip(tmp_path):
    case = dataclasses.replace(_case(stride=13, starts=[0, 2, 3, 9], ends=[10, 8, 3, 10], next_n=2),
                               meta={"seed": 3})
    back = TopkCase.load(case.save(tmp_path / "c.npz"))
    assert torch.equal(back.storage, case.storage) and back.width == 10 and back.k == 3 and back.next_n == 2
    assert torch.equal(back.starts, case.starts) and torch.equal(back.ends, case.ends) and back.meta == {"seed": 3}


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "golden" / "topk").glob("*.npz")),
                         ids=lambda p: p.stem)
def test_a_golden_case_saved_again_writes_its_own_meta(path, tmp_path):
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
    with np.load(TopkCase.load(path).save(tmp_path / "again.npz")) as z:
        assert json.loads(str(z["meta"])) == meta, "TopkMeta writes the meta the golden file holds (its nan too)"


def test_a_meta_without_its_field_is_refused_at_save_and_a_bad_one_at_load(tmp_path):
    with pytest.raises(SpecError) as info:
        dataclasses.replace(_case(), meta={"colour": "red"}).save(tmp_path / "c.npz")
    assert info.value.field == "meta" and info.value.value == ["colour"], f"{info.value}"
    path = _case().save(tmp_path / "c.npz")
    with np.load(path) as z:
        arrays = dict(z)
    arrays["meta"] = np.array(json.dumps({**json.loads(str(arrays["meta"])), "k": "3"}))
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(SpecError) as info:
        TopkCase.load(tmp_path / "bad.npz")
    assert info.value.field.endswith("bad.npz meta.k") and info.value.value == "3", f"{info.value}"


def test_load_refuses_a_member_larger_than_the_meta_says(tmp_path):
    case = _case()
    path = case.save(tmp_path / "c.npz")
    with np.load(path) as z:
        arrays = dict(z)
    arrays["storage"] = np.zeros((400, 10), dtype=np.float32)  # the meta says 4 rows
    np.savez(tmp_path / "big.npz", **arrays)
    with pytest.raises(SpecError, match="storage"):
        TopkCase.load(tmp_path / "big.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(SpecError, match=r"junk\.npz"):
        TopkCase.load(tmp_path / "junk.npz")
    with zipfile.ZipFile(tmp_path / "nometa.npz", "w") as archive:
        archive.writestr("storage.npy", b"")
    with pytest.raises(SpecError, match="meta"):
        TopkCase.load(tmp_path / "nometa.npz")


@pytest.mark.parametrize("form", list(WindowForm))
def test_encode_says_the_windows_each_form_can(form):
    case = _case(rows=4, next_n=2, ends=list(decode_ends(torch.tensor([7, 10]), 2).tolist()))
    inputs = encode_topk(case, _contract(form))
    starts, ends = inputs.windows()
    assert torch.equal(starts, case.starts) and torch.equal(ends, case.ends), (form, starts, ends)
    assert inputs.logits.data_ptr() == case.storage.data_ptr()


def test_a_form_without_starts_refuses_a_window_past_zero():
    case = _case(starts=[0, 1, 0, 0])
    for form in (WindowForm.LENGTHS, WindowForm.DECODE_RULE):
        assert "starts past column 0" in _contract(form).accepts(case, "cpu")
        with pytest.raises(SpecError, match="windows"):
            encode_topk(case, _contract(form))
    assert _contract(WindowForm.STARTS_LENGTHS).accepts(case, "cpu") is None


def test_decode_rule_recognised_only_where_it_holds():
    case = _case(rows=4, next_n=2, ends=[6, 7, 0, 1])
    assert decode_seq_lens(case).tolist() == [7, 1]
    odd = _case(rows=4, next_n=2, ends=[5, 7, 0, 1])
    assert decode_seq_lens(odd) is None
    assert "decode rule" in _contract(WindowForm.DECODE_RULE).accepts(odd, "cpu")
    assert "next_n" in _contract(WindowForm.DECODE_RULE, next_n=(1,)).accepts(case, "cpu")


@pytest.mark.parametrize(("contract", "case", "reason"), [
    (_contract(ks=(512,)), _case(k=3), "ks"),
    (_contract(max_k=2), _case(k=3), "max_k"),
    (_contract(max_width=8), _case(), "max_width"),
    (_contract(max_rows=2), _case(), "max_rows"),
    (_contract(width_at_least_k=True), _case(width=2, k=3, ends=[2] * 4), "narrower than k"),
    (_contract(row_stride=RowStride.MULTIPLE_OF_4), _case(width=10), "multiple of 4"),
    (_contract(row_stride=RowStride.EQUALS_WIDTH), _case(width=10, stride=12), "differs from width"),
    (_contract(devices=("cuda",)), _case(), "devices"),
])
def test_accepts_names_the_declared_fact(contract, case, reason):
    assert reason in contract.accepts(case, "cpu")


def test_a_kernel_that_writes_its_logits_gets_a_copy():
    case = _case(stride=12)
    inputs = encode_topk(case, _contract(mutates_logits=True))
    inputs.logits.fill_(0.0)
    assert case.storage.sum() > 0 and inputs.logits.stride() == (12, 1)
