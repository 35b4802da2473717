"""The poison sentinel: a NaN payload arithmetic never makes, so unwritten output is told from NaN."""

from __future__ import annotations

import pytest
import torch

from difftest.core.poison import is_poison, poisoned


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_poison_survives_roundtrip_and_is_nan(dtype):
    buf = poisoned((3, 5), dtype, "cpu")
    assert buf.dtype == dtype and torch.isnan(buf).all(), f"{buf=}"
    buf[1, 2] = 0.0
    mask = is_poison(buf)
    assert mask.sum() == 14 and not mask[1, 2], f"{mask=}"
    assert not is_poison(buf.double()).any(), "float64 has no sentinel; nothing counts as poison"


def test_computed_nans_are_not_poison():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        computed = torch.tensor([0.0, -1.0, 1.0], dtype=dtype).log().sqrt()  # -inf, nan, 0 and arithmetic NaNs
        made = torch.stack([torch.tensor(float("nan"), dtype=dtype), (torch.zeros((), dtype=dtype) / 0), *computed])
        assert torch.isnan(made).any() and not is_poison(made).any(), f"{dtype}: {made=}"
