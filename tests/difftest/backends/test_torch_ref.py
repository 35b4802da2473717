"""The torch backend reads what it is handed: the whole contract, and what-if encodings."""

from __future__ import annotations

import torch

from difftest.backends.torch_ref import TorchBackend
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.generators import build_case
from difftest.oracles.paged_mqa_logits import reference
from tests.support import TINY


def test_contract():
    c = TorchBackend.contract
    assert (c.length_encoding, c.cache_layout, c.mask) == (LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT,
                                                           MaskConvention.TAIL_NEG_INF)
    assert c.rtol <= 1e-9 and c.library.startswith("torch "), f"{c=}"


def test_float64_on_cpu_and_bitwise_oracle():
    case = build_case(TINY.replace(next_n=3), 4)
    got = TorchBackend()(encode(case, TorchBackend.contract), None)
    assert got.dtype == torch.float64 and torch.equal(got, reference(case))


def test_reading_the_other_layout_changes_the_answer():
    """It decodes with the layout it is told: bytes of one layout read as the other are wrong."""
    case = build_case(TINY.replace(next_n=2, lengths=(20, 20)), 0)
    inputs = encode(case, TorchBackend.contract, layout=CacheLayout.TOKEN_INTERLEAVED)
    lied = type(inputs)(**{**inputs.__dict__, "layout": CacheLayout.BLOCK_SPLIT})
    got, want = TorchBackend()(lied, None), reference(case)
    assert not torch.equal(got.nan_to_num(0), want), "a layout mix-up went unnoticed"
