"""The registry of operations: each indexer stage the engine can test, by name (docs/writing-an-operation.md).

This layer sits above the engine (which is handed an Operation and never imports one) and below the records,
workflows and shells (which look operations up here by their OperationKind)."""

from __future__ import annotations

from difftest.core.errors import require
from difftest.core.kinds import OperationKind
from difftest.core.operation import Operation
from difftest.operations.indexer import INDEXER
from difftest.operations.paged import PAGED_LOGITS
from difftest.operations.prefill_indexer import PREFILL_INDEXER
from difftest.operations.ragged import RAGGED_LOGITS
from difftest.operations.topk import TOPK

OPERATIONS: dict[OperationKind, Operation] = {op.kind: op for op in (PAGED_LOGITS, RAGGED_LOGITS, TOPK, INDEXER,
                                                                    PREFILL_INDEXER)}


def operation(kind: OperationKind | str) -> Operation:
    """The operation of `kind` (or its name); SpecError naming the operations there are."""
    names = [k.value for k in OPERATIONS]
    value = kind.value if isinstance(kind, OperationKind) else kind
    require(value in names, "operation", value, f"one of the operations registered: {names}")
    return OPERATIONS[OperationKind(value)]


__all__ = ["OPERATIONS", "operation"]
