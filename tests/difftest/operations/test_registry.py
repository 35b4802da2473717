"""The registry of operations, and the paged-logits operation's functions agreeing with its engine."""

from __future__ import annotations

import pytest

from difftest.backends import get_backends
from difftest.core.errors import SpecError
from difftest.core.kinds import Headline, OperationKind
from difftest.core.spec import CaseSpec
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Named, run_one
from difftest.engine.runner import run
from difftest.generators.tensors import build_case
from difftest.operations import OPERATIONS, operation


def test_every_registered_operation_is_found_by_its_name_and_declares_its_headline():
    for kind, op in OPERATIONS.items():
        assert operation(kind.value) is op and op.name == kind.value
        assert op.headlines
    assert operation(OperationKind.TOPK).headlines == (Headline.SELECTION,)
    assert operation(OperationKind.RAGGED_LOGITS).headlines == (Headline.MASK,)


def test_an_operation_not_registered_is_one_line_naming_those_that_are():
    with pytest.raises(SpecError, match=r"operation.*nonsense.*paged-logits"):
        operation("nonsense")


def test_the_ragged_and_topk_backend_tables_are_registered_under_their_operations():
    assert "deepgemm-ragged" in operation(OperationKind.RAGGED_LOGITS).backends()
    assert {"torch-topk", "vllm-top-k-per-row-prefill"} <= set(operation(OperationKind.TOPK).backends())


def test_the_paged_operation_through_the_generic_runner_gives_the_engines_verdict():
    case = build_case(CaseSpec(name="t", batch=2, max_model_len=130, heads=8, head_dim=32), 0)
    config = RunConfig()
    for name in ("torch", "aiter-triton-stage1"):
        backend = get_backends([name])[0]
        engine = run([backend], [case], config)[0]
        generic = run_one(operation(OperationKind.PAGED_LOGITS), Named(name, backend), case, config)
        assert generic.verdict == engine.verdict
        if engine.comparison:
            assert generic.comparison.mask_rows == engine.comparison.mask_rows
