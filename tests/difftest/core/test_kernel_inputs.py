"""Encoders: cache bytes, paging, length encodings and the whole encode(), each round-tripped."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from difftest.backends.torch_ref import TorchBackend
from difftest.core.contract import Contract
from difftest.core.errors import SpecError
from difftest.core.fp8 import decode
from difftest.core.kernel_inputs import (
    decode_row_lens,
    encode,
    encode_lengths,
    ragged_token_ids,
    repage_to_tokens,
    token_table,
)
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding
from difftest.core.layout import pack_cache, unpack_cache
from difftest.generators import CaseSpec, LengthDist, Stale, Values, build_case
from difftest.oracles.paged_mqa_logits import reference
from tests.support import TINY_SPECS, assert_same_logits, bits

CASES = [(spec, seed) for spec in TINY_SPECS for seed in (0, 1)]
CASE_IDS = [f"{spec.name}-s{seed}" for spec, seed in CASES]


def _case(spec: CaseSpec, seed: int, encoding: LengthEncoding | None = None):
    case = build_case(spec, seed)
    return repage_to_tokens(case) if encoding == LengthEncoding.PREFIX_SUM else case


def _contract(**changes) -> Contract:
    return dataclasses.replace(TorchBackend.contract, **changes)


# --------------------------------------------------------------------------- cache bytes

@pytest.mark.parametrize("layout", list(CacheLayout), ids=lambda x: x.value)
@pytest.mark.parametrize("spec, seed", CASES, ids=CASE_IDS)
def test_pack_unpack_roundtrip(spec, seed, layout):
    case = build_case(spec, seed)
    packed = pack_cache(case.k_pool, case.scale_pool, layout)
    nb, bs, d = case.k_pool.shape
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (nb, bs, 1, d + 4), f"{packed.shape=}"
    keys, scales = unpack_cache(packed, d, layout)
    assert torch.equal(keys, case.k_pool), f"{layout.value}: keys differ"
    assert torch.equal(bits(scales), bits(case.scale_pool)), f"{layout.value}: scale bits differ"


def test_block_split_bytes_are_where_domain_says():
    """Per block: block_size * D key bytes, then block_size fp32 scales (docs/reference/layouts.md)."""
    case = build_case(TINY_SPECS[0], 0)
    packed = pack_cache(case.k_pool, case.scale_pool, CacheLayout.BLOCK_SPLIT)
    nb, bs, d = case.k_pool.shape
    for block in range(nb):
        flat = packed[block].flatten()
        assert torch.equal(flat[: bs * d], case.k_pool[block].flatten()), f"{block=}: keys"
        for slot in range(bs):
            scale = flat[bs * d + 4 * slot: bs * d + 4 * slot + 4].view(torch.float32)
            assert bits(scale) == bits(case.scale_pool[block, slot:slot + 1]), f"{block=}, {slot=}"


def test_token_interleaved_bytes_are_where_domain_says():
    """Per token: D key bytes, then its 4 scale bytes."""
    case = build_case(TINY_SPECS[0], 0)
    packed = pack_cache(case.k_pool, case.scale_pool, CacheLayout.TOKEN_INTERLEAVED)
    nb, bs, d = case.k_pool.shape
    for block in range(nb):
        flat = packed[block].flatten()
        for slot in range(bs):
            token = flat[slot * (d + 4): (slot + 1) * (d + 4)]
            assert torch.equal(token[:d], case.k_pool[block, slot]), f"{block=}, {slot=}: keys"
            scale = token[d:].view(torch.float32)
            assert bits(scale) == bits(case.scale_pool[block, slot:slot + 1]), f"{block=}, {slot=}"


def test_layouts_differ_in_bytes_but_decode_the_same():
    case = build_case(TINY_SPECS[0], 0)
    split = pack_cache(case.k_pool, case.scale_pool, CacheLayout.BLOCK_SPLIT)
    inter = pack_cache(case.k_pool, case.scale_pool, CacheLayout.TOKEN_INTERLEAVED)
    assert not torch.equal(split, inter), "block-split and token-interleaved bytes coincide at block_size 4"
    for layout, packed in ((CacheLayout.BLOCK_SPLIT, split), (CacheLayout.TOKEN_INTERLEAVED, inter)):
        keys, scales = unpack_cache(packed, case.head_dim, layout)
        assert torch.equal(keys, case.k_pool) and torch.equal(bits(scales), bits(case.scale_pool)), f"{layout.value}"
    # Read with the wrong layout, the bytes mean something else: the mix-up is visible.
    keys, _ = unpack_cache(split, case.head_dim, CacheLayout.TOKEN_INTERLEAVED)
    assert not torch.equal(keys, case.k_pool), "a layout mix-up would go unnoticed"


def test_layouts_coincide_at_block_size_one():
    case = build_case(next(s for s in TINY_SPECS if s.block_size == 1), 0)
    split = pack_cache(case.k_pool, case.scale_pool, CacheLayout.BLOCK_SPLIT)
    inter = pack_cache(case.k_pool, case.scale_pool, CacheLayout.TOKEN_INTERLEAVED)
    assert torch.equal(split, inter), "docs/reference/layouts.md: at block_size 1 both layouts coincide"


def test_unpack_rejects_wrong_shape():
    case = build_case(TINY_SPECS[0], 0)
    packed = pack_cache(case.k_pool, case.scale_pool, CacheLayout.BLOCK_SPLIT)
    with pytest.raises(SpecError) as info:
        unpack_cache(packed, case.head_dim + 16, CacheLayout.BLOCK_SPLIT)
    assert info.value.field == "kv_cache.shape" and "D + 4 = 36" in info.value.expected, f"{info.value}"


# --------------------------------------------------------------------------- paging

@pytest.mark.parametrize("spec, seed", CASES, ids=CASE_IDS)
def test_token_table_maps_every_logical_token(spec, seed):
    case = build_case(spec, seed)
    table = token_table(case)
    bs = case.block_size
    assert table.dtype == torch.int32 and tuple(table.shape) == (case.batch, case.block_table.shape[1] * bs)
    bt = case.block_table.tolist()
    for b in range(case.batch):
        for t in range(table.shape[1]):
            want = bt[b][t // bs] * bs + t % bs
            assert table[b, t] == want, f"{b=}, {t=}: {table[b, t].item()=} {want=}"


@pytest.mark.parametrize("spec, seed", CASES, ids=CASE_IDS)
def test_repage_to_tokens_gives_identical_logits(spec, seed):
    case = build_case(spec, seed)
    paged = repage_to_tokens(case)
    assert paged.block_size == 1 and paged.validate() is paged
    got, want = reference(paged), reference(case)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), f"{spec.name} {seed=}: -inf pattern"
    assert torch.equal(got, want), f"{spec.name} {seed=}: max diff {(got - want).nan_to_num(0).abs().max()}"


@pytest.mark.parametrize("spec, seed", CASES, ids=CASE_IDS)
def test_ragged_token_ids_concatenate_visible_tokens(spec, seed):
    case = build_case(spec, seed)
    ids = ragged_token_ids(case)
    table = token_table(case)
    want = torch.cat([table[b, :length] for b, length in enumerate(case.seq_lens.tolist())])
    assert torch.equal(ids, want), f"{spec.name} {seed=}"
    assert len(ids) == int(case.seq_lens.sum()), f"{len(ids)=}"


# --------------------------------------------------------------------------- lengths

@pytest.mark.parametrize("encoding", list(LengthEncoding), ids=lambda e: e.value)
@pytest.mark.parametrize("spec, seed", CASES, ids=CASE_IDS)
def test_every_length_encoding_decodes_to_row_lens(spec, seed, encoding):
    case = _case(spec, seed, encoding)
    inputs = encode(case, _contract(), encoding=encoding)
    assert inputs.context_lens.dtype == torch.int32, f"{inputs.context_lens.dtype=}"
    got = decode_row_lens(inputs, case.batch, case.next_n)
    assert torch.equal(got, case.row_lens()), f"{encoding.value}: {got.tolist()=} {case.row_lens().tolist()=}"


def test_length_encoding_shapes():
    spec = next(s for s in TINY_SPECS if s.name == "explicit-lengths")
    assert (spec.lengths, spec.next_n) == ((0, 1, 2, 3, 4, 5, 20), 3), f"{spec=}"
    case = build_case(spec, 0)
    rows = case.row_lens()
    per_row = encode_lengths(case, LengthEncoding.PER_ROW)["context_lens"]
    per_seq = encode_lengths(case, LengthEncoding.PER_SEQUENCE)["context_lens"]
    assert tuple(per_row.shape) == (7, 3) and torch.equal(per_row.long(), rows), f"{per_row.tolist()=}"
    assert per_seq.tolist() == [0, 1, 2, 3, 4, 5, 20], f"{per_seq.tolist()=}"
    assert torch.equal(per_row[:, -1], per_seq), "the per-sequence table is the per-row table's last column"
    assert rows.min() >= 0, "padding and short sequences must clamp at 0, not go negative"
    prefix = encode_lengths(repage_to_tokens(case), LengthEncoding.PREFIX_SUM)["context_lens"]
    assert prefix.tolist() == [0, 0, 1, 3, 6, 10, 15, 35], f"{prefix.tolist()=}"


def test_prefix_sum_needs_block_size_one():
    case = build_case(TINY_SPECS[0], 0)
    with pytest.raises(SpecError) as info:
        encode(case, _contract(), encoding=LengthEncoding.PREFIX_SUM)
    assert (info.value.field, info.value.value) == ("block_size", 4), f"{info.value}"


@pytest.mark.parametrize("spec, seed", CASES, ids=CASE_IDS)
def test_flattened_encodings_keep_canonical_row_order(spec, seed):
    case = build_case(spec, seed)
    rows, n = case.row_lens(), case.next_n
    flat = encode(case, _contract(), encoding=LengthEncoding.FLATTENED)
    indexed = encode(case, _contract(), encoding=LengthEncoding.FLATTENED_INDICES)
    q = case.q.view(Fp8Flavour.E4M3FN.dtype) if case.fp8 == Fp8Flavour.E4M3FN else None
    for inputs in (flat, indexed):
        assert tuple(inputs.q.shape) == (case.rows, 1, case.heads, case.head_dim), f"{inputs.q.shape=}"
        assert torch.equal(inputs.weights, case.weights)
    for r in range(case.rows):
        b, j = divmod(r, n)
        for inputs in (flat, indexed):
            assert inputs.context_lens[r] == rows[b, j], f"{inputs.encoding.value} {r=}, {b=}, {j=}"
            if q is not None:
                assert torch.equal(inputs.q[r, 0].view(torch.uint8), case.q[b, j]), f"{inputs.encoding.value} {r=}: q"
        assert torch.equal(flat.block_table[r], case.block_table[b]), f"flattened {r=}: block-table row"
        assert indexed.indices[r] == b, f"flattened-indices {r=}: {indexed.indices[r].item()=} {b=}"
    assert torch.equal(indexed.block_table, case.block_table), "flattened-indices keeps one table row per request"
    assert flat.indices is None


def test_encode_converts_fp8_flavour_and_keeps_values():
    case = build_case(next(s for s in TINY_SPECS if s.fp8 == Fp8Flavour.E4M3FNUZ), 0)
    inputs = encode(case, _contract(fp8=Fp8Flavour.E4M3FN))
    assert inputs.q.dtype == torch.float8_e4m3fn and inputs.fp8 == Fp8Flavour.E4M3FN, f"{inputs.q.dtype=}"
    assert torch.equal(inputs.q.double().nan_to_num(7.0), case.q_values().nan_to_num(7.0)), "q values changed"
    keys, _ = unpack_cache(inputs.kv_cache, case.head_dim, inputs.layout)
    got, want = decode(keys, Fp8Flavour.E4M3FN), case.k_values()
    assert torch.equal(got.isnan(), want.isnan()), "NaN canaries moved"
    assert torch.equal(got.nan_to_num(0), want.nan_to_num(0)), "key values changed"


def test_encode_repages_for_a_block_size_one_contract():
    case = build_case(TINY_SPECS[0], 0)
    inputs = encode(case, _contract(block_sizes=(1,)))
    assert inputs.block_size == 1 and tuple(inputs.kv_cache.shape[:2]) == (case.k_pool.shape[0] * 4, 1)
    assert torch.equal(inputs.block_table, token_table(case)), "token table expected as the block table"
    with pytest.raises(SpecError) as info:
        encode(case, _contract(block_sizes=(64,)))
    assert info.value.field == "block_size" and "[64]" in info.value.expected, f"{info.value}"


# --------------------------------------------------------------------------- the torch backend decodes it all

@pytest.mark.parametrize("flavour", list(Fp8Flavour), ids=lambda f: f.value)
@pytest.mark.parametrize("layout", list(CacheLayout), ids=lambda x: x.value)
@pytest.mark.parametrize("encoding", list(LengthEncoding), ids=lambda e: e.value)
def test_torch_backend_through_every_encoding_gives_oracle_logits(encoding, layout, flavour):
    backend = TorchBackend()
    for spec in TINY_SPECS:
        case = _case(spec, 5, encoding)
        inputs = encode(case, _contract(fp8=flavour), encoding=encoding, layout=layout)
        assert (inputs.encoding, inputs.layout, inputs.fp8) == (encoding, layout, flavour)
        got = backend(inputs, None)
        assert_same_logits(got, reference(case), rel=1e-12,
                           what=f"{spec.name} {encoding.value} {layout.value} {flavour.value}")


# --------------------------------------------------------------------------- properties over drawn specs

small_specs = st.builds(
    CaseSpec,
    name=st.just("drawn"),
    batch=st.integers(1, 4),
    next_n=st.integers(1, 4),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([16, 32]),
    block_size=st.sampled_from([1, 2, 3, 4, 8]),
    max_model_len=st.integers(1, 24),
    length_dist=st.sampled_from(list(LengthDist)),
    values=st.sampled_from(list(Values)),
    padding=st.integers(0, 2),
    shared_blocks=st.booleans(),
    stale=st.sampled_from(list(Stale)),
    extra_columns=st.integers(0, 2),
    canary_blocks=st.integers(1, 3),
    fp8=st.sampled_from(list(Fp8Flavour)),
)


@given(spec=small_specs, seed=st.integers(0, 2**31 - 1),
       encoding=st.sampled_from(list(LengthEncoding)), layout=st.sampled_from(list(CacheLayout)))
def test_encode_roundtrip_property(spec, seed, encoding, layout):
    case = _case(spec, seed, encoding)
    inputs = encode(case, _contract(), encoding=encoding, layout=layout)
    assert torch.equal(decode_row_lens(inputs, case.batch, case.next_n), case.row_lens()), f"{spec=}, {seed=}"
    keys, scales = unpack_cache(inputs.kv_cache, case.head_dim, layout)
    assert torch.equal(decode(keys, inputs.fp8).nan_to_num(7.0), case.k_values().nan_to_num(7.0)), f"{spec=}, {seed=}"
    assert torch.equal(bits(scales), bits(case.scale_pool)), f"{spec=}, {seed=}"
    assert_same_logits(TorchBackend()(inputs, None), reference(case), rel=1e-12, what=f"{spec=}, {seed=}")
