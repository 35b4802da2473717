"""AITER's ROCm wrappers: declared contracts, where they are looked for, and the exact reasons they
skip off ROCm (no machine here has a ROCm GPU, so they are never launched in these tests)."""

from __future__ import annotations

import pytest
import torch

from difftest.backends import get_backends
from difftest.backends.aiter_rocm import WRAPPER_MODULES, load_wrappers, native_fp8
from difftest.core.kinds import Fp8Flavour, LengthEncoding, MaskConvention
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case

NAMES = ("aiter-rocm-stage1", "aiter-rocm-fused", "aiter-rocm-stage1-ragged", "aiter-rocm-fused-ragged")
OFF_ROCM = pytest.mark.skipif(torch.version.hip is not None, reason="checks the reasons given off ROCm")


@pytest.mark.parametrize("name", NAMES)
def test_contract_follows_the_wrapper(name):
    (backend,) = get_backends([name])
    contract = backend.contract
    ragged = name.endswith("-ragged")
    assert contract.length_encoding == (LengthEncoding.PREFIX_SUM if ragged else LengthEncoding.PER_SEQUENCE)
    assert contract.block_sizes == (1,) and contract.devices == ("cuda",)
    assert contract.mask == MaskConvention.TAIL_NEG_INF, "the caller pre-fills -inf"
    assert contract.heads_multiple_of == (32 if "stage1" in name else 1)


@OFF_ROCM
@pytest.mark.parametrize("name", NAMES)
def test_every_wrapper_skips_off_rocm_with_its_reason(name):
    (backend,) = get_backends([name])
    assert backend.unavailable_reason("cpu") == "AITER's wrappers run on ROCm GPUs only (device cpu)"
    no_rocm = "AITER's wrappers need a ROCm build of torch (torch.version.hip is None)"
    assert backend.unavailable_reason("cuda") == no_rocm
    result = run([backend], [build_case(CaseSpec(batch=2, next_n=2, block_size=1, max_model_len=64), 0)],
                 RunConfig())[0]
    assert result.verdict.value == "SKIP" and "ROCm GPUs only" in result.reason


@OFF_ROCM
def test_wrappers_are_looked_for_under_both_module_paths():
    module, how = load_wrappers()
    assert module is None, "aiter's __init__ needs ROCm"
    assert all(f"{path}:" in how for path in WRAPPER_MODULES), how


@OFF_ROCM
def test_the_native_fp8_off_rocm_is_e4m3fn():
    assert native_fp8() == Fp8Flavour.E4M3FN
