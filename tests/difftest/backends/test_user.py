"""The user-function adapter: the decorator, FunctionBackend, and the calling convention."""

from __future__ import annotations

import torch

from difftest.backends.user import FunctionBackend, backend
from difftest.core.kernel_inputs import encode
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
