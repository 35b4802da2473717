"""fp8 flavours: decoding every byte, exact encoding, and e4m3fn <-> e4m3fnuz conversion."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from difftest.core.errors import SpecError
from difftest.core.fp8 import COMMON_MAX, convert, decode, encode_exact
from difftest.core.kinds import Fp8Flavour
from tests.support import FP8_TABLES

ALL_BYTES = torch.arange(256, dtype=torch.uint8)
FN, FNUZ = Fp8Flavour.E4M3FN, Fp8Flavour.E4M3FNUZ
# Values both flavours represent: NaN, 0 and every value in both byte tables (|x| <= 240, and not
# the e4m3fnuz subnormals finer than e4m3fn's 2^-9 grid).
COMMON_VALUES = {v for v in FP8_TABLES[FN] if not math.isnan(v)} & {v for v in FP8_TABLES[FNUZ] if not math.isnan(v)}


def _in_both(values: torch.Tensor) -> torch.Tensor:
    return torch.tensor([math.isnan(v) or v in COMMON_VALUES for v in values.tolist()], dtype=torch.bool)


def _same_value(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("flavour", list(Fp8Flavour), ids=lambda f: f.value)
def test_decode_matches_bit_fields(flavour):
    got = decode(ALL_BYTES, flavour).tolist()
    for byte, (value, want) in enumerate(zip(got, FP8_TABLES[flavour], strict=True)):
        assert _same_value(value, want), f"{flavour.value} {byte=:#04x}: {value=} {want=}"


def test_fnuz_is_half_of_fn_for_the_same_bits():
    """docs/reference/layouts.md: same bits decode to half the value on gfx942 (except NaN/zero codes)."""
    fn, fnuz = decode(ALL_BYTES, FN), decode(ALL_BYTES, FNUZ)
    both = torch.isfinite(fn) & torch.isfinite(fnuz) & (ALL_BYTES != 0x80)
    assert torch.equal(fnuz[both] * 2, fn[both]), f"{torch.nonzero(fnuz[both] * 2 != fn[both])=}"


@pytest.mark.parametrize("flavour", list(Fp8Flavour), ids=lambda f: f.value)
def test_nan_byte_decodes_to_nan(flavour):
    value = decode(torch.tensor([flavour.nan_byte], dtype=torch.uint8), flavour).item()
    assert math.isnan(value), f"{flavour.value}: {flavour.nan_byte=:#04x} decodes to {value=}"


def test_common_max_is_the_largest_value_of_both():
    fnuz = decode(ALL_BYTES, FNUZ)
    assert fnuz.nan_to_num(0).abs().max().item() == COMMON_MAX, f"{COMMON_MAX=}"
    assert (decode(ALL_BYTES, FN).nan_to_num(0).abs() == COMMON_MAX).any(), f"{COMMON_MAX=} not in e4m3fn"


@pytest.mark.parametrize("source, target", [(FN, FNUZ), (FNUZ, FN)], ids=["fn-to-fnuz", "fnuz-to-fn"])
def test_convert_keeps_every_value_within_common_range(source, target):
    raw = ALL_BYTES[_in_both(decode(ALL_BYTES, source))]
    assert len(raw) >= 230, f"{len(raw)=}"
    out = convert(raw, source, target, "x")
    before, after = decode(raw, source), decode(out, target)
    for byte, a, b in zip(raw.tolist(), before.tolist(), after.tolist(), strict=True):
        assert _same_value(a, b), f"{source.value}->{target.value} {byte=:#04x}: {a=} -> {b=}"
    back = convert(out, target, source, "x")
    assert torch.equal(decode(back, source).nan_to_num(7.0), before.nan_to_num(7.0)), "round trip changed values"


def test_nan_canaries_stay_nan_both_ways():
    fn_nan = torch.tensor([FN.nan_byte, 0xFF], dtype=torch.uint8)  # both e4m3fn NaN codes
    as_fnuz = convert(fn_nan, FN, FNUZ, "k_pool")
    assert as_fnuz.tolist() == [FNUZ.nan_byte] * 2, f"{as_fnuz.tolist()=}"
    back = convert(as_fnuz, FNUZ, FN, "k_pool")
    assert decode(back, FN).isnan().all(), f"{back.tolist()=}"


def test_convert_same_flavour_is_identity():
    assert convert(ALL_BYTES, FN, FN, "q") is ALL_BYTES


def test_convert_rejects_values_outside_common_range():
    raw = torch.tensor([0x7E], dtype=torch.uint8)  # 448 in e4m3fn, above e4m3fnuz's 240
    with pytest.raises(SpecError) as info:
        convert(raw, FN, FNUZ, "q")
    assert info.value.field == "q" and info.value.value == 448.0, f"{info.value=}"
    assert "e4m3fnuz" in info.value.expected, f"{info.value.expected=}"


def test_convert_rejects_fnuz_values_below_fn_subnormals():
    raw = torch.tensor([0x01], dtype=torch.uint8)  # 2^-10 in e4m3fnuz
    with pytest.raises(SpecError) as info:
        convert(raw, FNUZ, FN, "k_pool")
    assert (info.value.field, info.value.value) == ("k_pool", 2.0 ** -10), f"{info.value=}"


def test_encode_exact_rejects_unrepresentable_values():
    with pytest.raises(SpecError) as info:
        encode_exact(torch.tensor([1.0, 1.0625]), FN, "weights")
    assert (info.value.field, info.value.value) == ("weights", 1.0625), f"{info.value=}"
    raw = encode_exact(torch.tensor([1.0, -2.5, 240.0, float("nan")]), FN, "q")
    assert decode(raw, FN)[:3].tolist() == [1.0, -2.5, 240.0], f"{raw.tolist()=}"


@given(st.lists(st.integers(0, 255), min_size=1, max_size=64))
def test_convert_roundtrip_property(raw_bytes):
    raw = torch.tensor(raw_bytes, dtype=torch.uint8)
    values = decode(raw, FN)
    raw = raw[_in_both(values)]
    there = convert(raw, FN, FNUZ, "x")
    back = convert(there, FNUZ, FN, "x")
    a, b = decode(raw, FN), decode(back, FN)
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0)), f"{raw.tolist()=}"
