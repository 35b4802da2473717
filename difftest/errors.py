"""The one error type for impossible input: it names the field, its value and what is allowed."""

from __future__ import annotations

from typing import Any


class SpecError(ValueError):
    """A case, spec, option or tensor that cannot describe a paged MQA logits problem."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}={value!r}: expected {expected}")


def require(condition: bool, field: str, value: Any, expected: str) -> None:
    """Raise SpecError(field, value, expected) unless condition holds."""
    if not condition:
        raise SpecError(field, value, expected)
