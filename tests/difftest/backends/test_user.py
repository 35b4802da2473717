"""The user-function adapter: the decorator, FunctionBackend, and the calling convention."""

from __future__ import annotations

import pytest
import torch

from difftest.backends.registry import as_backend
from difftest.backends.user import FunctionBackend, backend
from difftest.core.errors import SpecError
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import (
    Fp8Flavour,
    IndexConvention,
    LogitsForm,
    MaskConvention,
    TopkPadding,
    WindowForm,
)
from difftest.core.ragged import RaggedContract, RaggedInputs
from difftest.core.topk import TopkContract, TopkInputs
from difftest.generators import build_case
from difftest.oracles.paged_mqa_logits import reference
from tests import user_backends as ub
from tests.support import TINY


def test_decorator_marks_contract_and_name():
    @backend(contract=ub.PER_ROW)
    def mine(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return torch.zeros(1)

    @backend(contract=ub.PER_SEQUENCE, name="given")
    def other(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return torch.zeros(1)

    assert mine.difftest_contract is ub.PER_ROW and mine.difftest_name == "mine"
    assert other.difftest_name == "given" and FunctionBackend.from_function(other).name == "given"


def test_function_backend_passes_deepgemm_arguments_in_order():
    seen = {}

    @backend(contract=ub.PER_ROW)
    def spy(q, kv_cache, weights, context_lens, block_table, max_model_len):
        seen.update(q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens,
                    block_table=block_table, max_model_len=max_model_len)
        return ub.logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)

    case = build_case(TINY.replace(next_n=2), 0)
    inputs = encode(case, ub.PER_ROW)
    got = FunctionBackend.from_function(spy)(inputs, None)
    for name in ("q", "kv_cache", "weights", "context_lens", "block_table"):
        assert seen[name] is getattr(inputs, name), f"{name} not passed through"
    assert seen["max_model_len"] == case.max_model_len
    assert torch.equal(got, reference(case))


def test_function_backend_availability_follows_devices():
    fb = FunctionBackend.from_function(ub.per_sequence_reader)
    assert fb.unavailable_reason("cpu") is None
    assert fb.unavailable_reason("rocm") == "per_sequence_reader declares devices ['cpu', 'cuda'], not rocm"


# --------------------------------------------------------------------------- the other operations' conventions

_I32 = torch.int32


def _i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=_I32)


TOPK_WINDOWS = {  # form -> the window fields TopkInputs holds in it, as a function receives them by keyword
    WindowForm.STARTS_ENDS: dict(row_starts=_i32(0, 1), row_ends=_i32(3, 4)),
    WindowForm.STARTS_LENGTHS: dict(row_starts=_i32(0, 1), lengths=_i32(3, 3)),
    WindowForm.LENGTHS: dict(lengths=_i32(3, 4)),
    WindowForm.DECODE_RULE: dict(seq_lens=_i32(4), next_n=2),
}


@pytest.mark.parametrize("form", list(TOPK_WINDOWS), ids=[f.value for f in TOPK_WINDOWS])
def test_a_topk_function_gets_the_logits_k_and_its_window_forms_arguments_by_keyword(form):
    seen = {}
    contract = TopkContract(IndexConvention.ROW_RELATIVE, TopkPadding.PAST_CANDIDATES, form)

    @backend(contract)
    def spy(logits, k, **windows):
        seen.update(logits=logits, k=k, **windows)
        return torch.zeros((logits.shape[0], k), dtype=_I32)

    logits = torch.randn(2, 4)
    got = FunctionBackend.from_function(spy)(TopkInputs(logits=logits, k=2, form=form, **TOPK_WINDOWS[form]), None)
    assert got.shape == (2, 2) and seen.pop("logits") is logits and seen.pop("k") == 2
    assert seen.keys() == TOPK_WINDOWS[form].keys()
    assert all(seen[name] is value for name, value in TOPK_WINDOWS[form].items())


@pytest.mark.parametrize("form", list(LogitsForm))
def test_a_ragged_function_gets_its_six_tensors_and_max_seqlen_k_only_where_its_form_has_a_width(form):
    seen = {}

    @backend(RaggedContract(form, MaskConvention.TAIL_NEG_INF))
    def spy(q, k, k_scale, weights, k_start, k_end, **width):
        seen.update(tensors=(q, k, k_scale, weights, k_start, k_end), width=width)
        return torch.zeros(1)

    tensors = (torch.zeros(2, 4, 8), torch.zeros(5, 8), torch.ones(5), torch.ones(2, 4),
               _i32(0, 1), _i32(3, 5))
    relative = form == LogitsForm.WINDOW_RELATIVE
    inputs = RaggedInputs(*tensors, form=form, fp8=Fp8Flavour.E4M3FN, max_seqlen_k=4 if relative else None)
    FunctionBackend.from_function(spy)(inputs, None)
    assert all(a is b for a, b in zip(seen["tensors"], tensors, strict=True))
    assert seen["width"] == ({"max_seqlen_k": 4} if relative else {})


def test_the_function_of_a_contract_that_declares_no_stage_operation_is_no_backend():
    @backend(contract=ub.PER_ROW)
    def paged(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return torch.zeros(1)

    paged.difftest_contract = object()  # not one of difftest's contracts
    with pytest.raises(SpecError, match="a Backend, a factory of one, or a function decorated"):
        as_backend(paged, "backends", "mine")
