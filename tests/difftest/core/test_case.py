"""The Case model: per-row limits, validation errors, save/load, and the golden files."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from difftest.core.case import Case, row_limits
from difftest.core.errors import SpecError
from difftest.core.kinds import Fp8Flavour
from difftest.generators import CaseSpec, build_case
from tests.support import TINY, TINY_SPECS, bits, golden_params


def _tensor_fields(case: Case) -> dict[str, torch.Tensor]:
    return {f.name: getattr(case, f.name) for f in dataclasses.fields(case)
            if isinstance(getattr(case, f.name), torch.Tensor)}


# --------------------------------------------------------------------------- printing

def test_hypothesis_prints_a_drawn_case_as_the_call_that_draws_it_again():
    from hypothesis.vendor.pretty import pretty  # how hypothesis prints a falsifying example

    case = build_case(CaseSpec(name="mine", next_n=2, lengths=(3, 17), max_model_len=64), 7)
    text = pretty(case)
    fields = "{'name': 'mine', 'next_n': 2, 'max_model_len': 64, 'lengths': [3, 17]}"  # and the defaults
    assert text == f"build_case(CaseSpec.from_json({fields}), 7)", text
    again = eval(text, {"build_case": build_case, "CaseSpec": CaseSpec})
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(_tensor_fields(again).values(),
                                                             _tensor_fields(case).values(), strict=True))


def test_a_case_built_by_hand_prints_its_one_line():
    from hypothesis.vendor.pretty import pretty

    case = dataclasses.replace(build_case(CaseSpec(lengths=(5,)), 0), meta={})
    assert pretty(case) == repr(case) and repr(case).startswith("Case('random-s0', B=1 next_n=1 "), pretty(case)


# --------------------------------------------------------------------------- limits

@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_row_limits_formula(next_n):
    seq_lens = torch.tensor([0, 1, 2, 3, 4, 5, 17, 64])
    got = row_limits(seq_lens, next_n)
    assert tuple(got.shape) == (len(seq_lens), next_n), f"{tuple(got.shape)=}"
    for b, length in enumerate(seq_lens.tolist()):
        for j in range(next_n):
            want = max(length - next_n + j + 1, 0)
            assert got[b, j] == want, f"{length=}, {next_n=}, {j=}: {got[b, j].item()=} != {want=}"


def test_row_limits_last_column_is_the_sequence_length():
    seq_lens = torch.tensor([0, 3, 9])
    assert torch.equal(row_limits(seq_lens, 3)[:, -1], seq_lens), f"{row_limits(seq_lens, 3)=}"


def test_case_properties():
    case = build_case(TINY.replace(next_n=3, padding=1), 0)
    assert (case.batch, case.next_n, case.heads, case.head_dim, case.block_size) == (4, 3, 2, 16, 4)
    assert case.rows == 12, f"{case.rows=}"
    assert torch.equal(case.used_blocks(), (case.seq_lens + 3) // 4), f"{case.used_blocks()=}"
    assert "B=4 next_n=3 H=2 D=16 block=4" in case.describe(), f"{case.describe()=}"
    assert case.lengths == tuple(case.seq_lens.tolist()) and all(type(n) is int for n in case.lengths)
    assert f"L={list(case.lengths)}" in case.describe(), f"{case.describe()=}"


# --------------------------------------------------------------------------- validation

def _base() -> Case:
    return build_case(TINY.replace(lengths=(5, 9), next_n=2), 0)


@pytest.mark.parametrize("change, field, value_part, expected_part", [
    (lambda c: dict(seq_lens=torch.tensor([-1, 9])), "seq_lens", "-1", ">= 0"),
    (lambda c: dict(seq_lens=torch.tensor([5, 21])), "seq_lens", "21", "max_model_len = 20"),
    (lambda c: dict(block_table=c.block_table[:, :2]), "block_table.shape", "(2, 2)", "at least 3 columns"),
    (lambda c: dict(q=c.q[:, :0]), "next_n", "0", ">= 1"),
    (lambda c: dict(q=c.q[..., :8]), "D", "8", "multiple of 16"),
    (lambda c: dict(weights=c.weights[:, :1]), "weights.shape", "(4, 1)", "[B * next_n, H]"),
    (lambda c: dict(q=c.q.float()), "q.dtype", "float32", "uint8"),
    (lambda c: dict(scale_pool=c.scale_pool.double()), "scale_pool.dtype", "float64", "float32"),
    (lambda c: dict(max_model_len=0), "max_model_len", "0", ">= 1"),
    (lambda c: dict(seq_lens=torch.tensor([5, 9, 1])), "seq_lens.shape", "(3,)", "(2,)"),
])
def test_validate_names_field_value_and_expectation(change, field, value_part, expected_part):
    case = _base()
    bad = dataclasses.replace(case, **change(case))
    with pytest.raises(SpecError) as info:
        bad.validate()
    err = info.value
    assert err.field == field, f"{err.field=} {field=} ({err})"
    assert value_part in repr(err.value), f"{err.value=} {value_part=}"
    assert expected_part in err.expected, f"{err.expected=} {expected_part=}"
    assert str(err) == f"{field}={err.value!r}: expected {err.expected}", f"{err}"


def test_validate_rejects_block_ids_outside_the_pool():
    case = _base()
    table = case.block_table.clone()
    table[1, 0] = case.k_pool.shape[0]
    with pytest.raises(SpecError) as info:
        dataclasses.replace(case, block_table=table).validate()
    assert info.value.field == "block_table", f"{info.value}"


def test_validate_rejects_nan_scale_of_a_visible_key():
    case = _base()
    scales = case.scale_pool.clone()
    scales[int(case.block_table[0, 0]), 0] = float("nan")
    with pytest.raises(SpecError) as info:
        dataclasses.replace(case, scale_pool=scales).validate()
    assert info.value.field == "scale_pool", f"{info.value}"


def test_validate_accepts_nan_scales_past_the_end():
    """Canaries past a sequence's end are part of the problem, not an error."""
    case = _base()
    past = int(case.block_table[0, 1]), 1  # position 5 of sequence 0 (length 5), block 1 slot 1
    assert torch.isnan(case.scale_pool[past]), f"{case.scale_pool[past]=}: the generator put no canary there"
    case.validate()


# --------------------------------------------------------------------------- save / load

@pytest.mark.parametrize("spec", TINY_SPECS, ids=lambda s: s.name)
def test_save_then_load_gives_identical_tensors(spec, tmp_path):
    case = build_case(spec, 3)
    loaded = Case.load(case.save(tmp_path / f"{spec.name}.npz"))
    for name, tensor in _tensor_fields(case).items():
        other = getattr(loaded, name)
        assert other.dtype == tensor.dtype, f"{name}: {other.dtype=} {tensor.dtype=}"
        assert torch.equal(bits(other), bits(tensor)), f"{name} differs after save/load"
    assert (loaded.name, loaded.max_model_len, loaded.fp8) == (case.name, case.max_model_len, case.fp8)
    assert loaded.meta == json.loads(json.dumps(case.meta)), f"{loaded.meta=} {case.meta=}"


def test_save_writes_the_golden_format(tmp_path):
    case = build_case(TINY.replace(next_n=2), 1)
    with np.load(case.save(tmp_path / "c.npz")) as z:
        assert {"q", "kv_cache", "weights", "context_lens", "block_table", "meta"} <= set(z.files), f"{z.files=}"
        meta = json.loads(str(z["meta"]))
        assert meta["layout"] == "block-split" and meta["seq_lens"] == case.seq_lens.tolist(), f"{meta=}"
        assert z["context_lens"].dtype == np.int32 and z["kv_cache"].shape == (case.k_pool.shape[0], 4, 1, 20)
        assert np.array_equal(z["context_lens"], case.row_lens().numpy()), f"{z['context_lens']=}"


def test_load_rejects_inconsistent_context_lens(tmp_path):
    case = build_case(TINY.replace(next_n=2, lengths=(5, 9)), 1)
    path = case.save(tmp_path / "c.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["context_lens"] = arrays["context_lens"] + 1
    np.savez(path, **arrays)
    with pytest.raises(SpecError) as info:
        Case.load(path)
    assert info.value.field == "context_lens", f"{info.value}"


@pytest.mark.parametrize("path", golden_params())
def test_load_golden(path, tmp_path):
    case = Case.load(path)
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        stored_q, stored_table = z["q"], z["block_table"]
    assert case.name == meta["name"], f"{case.name=}"
    got = (case.batch, case.next_n, case.heads, case.head_dim, case.block_size, case.max_model_len)
    want = tuple(meta[k] for k in ("B", "next_n", "H", "D", "block_size", "max_model_len"))
    assert got == want, f"{got=} {want=}"
    assert case.fp8 == Fp8Flavour(meta["fp8"]) and case.seq_lens.tolist() == meta["seq_lens"], f"{meta=}"
    assert np.array_equal(case.q.numpy(), stored_q) and np.array_equal(case.block_table.numpy(), stored_table)
    again = Case.load(case.save(tmp_path / "again.npz"))
    for name, tensor in _tensor_fields(case).items():
        assert torch.equal(bits(getattr(again, name)), bits(tensor)), f"{meta['name']}: {name} differs after re-save"
    with np.load(tmp_path / "again.npz") as z:
        written = json.loads(str(z["meta"]))
    # The same meta, its layout the one save writes (it packs every cache block-split).
    assert written == {**meta, "layout": "block-split"}, f"{written=} {meta=}"


def test_save_refuses_a_meta_the_archive_cannot_hold(tmp_path):
    """Case.meta holds what CaseMeta names (seed, spec, families, note): anything else would make an archive
    Case.load refuses, so save refuses it first, naming the key."""
    case = dataclasses.replace(build_case(TINY, 1), meta={"colour": "red"})
    with pytest.raises(SpecError) as info:
        case.save(tmp_path / "c.npz")
    assert info.value.field == "meta" and info.value.value == ["colour"], f"{info.value}"
    assert not (tmp_path / "c.npz").exists()


def test_to_moves_every_tensor_and_keeps_values():
    case = _base()
    moved = case.to("cpu")
    for name, tensor in _tensor_fields(case).items():
        assert torch.equal(bits(getattr(moved, name)), bits(tensor)), name


def test_a_drawn_case_knows_its_lengths_and_its_copies_keep_them():
    drawn = build_case(TINY.replace(lengths=(7, 0, 20)), 0)
    assert drawn.known_lengths == (7, 0, 20) == tuple(drawn.seq_lens.tolist())
    assert drawn.to("cpu") is drawn, "already there: the case itself"
    copied = drawn.lengths_to(dataclasses.replace(drawn, name="copy"))
    assert copied.known_lengths == (7, 0, 20)
    read_on_demand = dataclasses.replace(drawn, name="fresh")
    assert read_on_demand.known_lengths is None and read_on_demand.lengths == (7, 0, 20)
    assert read_on_demand.known_lengths == (7, 0, 20), "read once, then known"
