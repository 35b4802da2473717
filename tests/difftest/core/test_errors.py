"""SpecError: one message shape that names the field, the value and what is allowed; first_line."""

from __future__ import annotations

import pytest

from difftest.core.errors import SpecError, first_line, require


def test_message_names_field_value_and_expectation():
    err = SpecError("next_n", 0, "an integer >= 1")
    assert (err.field, err.value, err.expected) == ("next_n", 0, "an integer >= 1")
    assert str(err) == "next_n=0: expected an integer >= 1"
    assert isinstance(err, ValueError), "callers catching ValueError still see it"


def test_require():
    require(True, "x", 1, "anything")
    with pytest.raises(SpecError, match=r"^lengths=\(-1,\): expected every length >= 0$"):
        require(False, "lengths", (-1,), "every length >= 0")


def test_first_line_quotes_the_first_line_of_a_message_and_nothing_for_none():
    advice = "CUDA out of memory. Tried to allocate 5.82 GiB.\nIf reserved but unallocated memory is large ..."
    assert first_line(MemoryError(advice)) == "CUDA out of memory. Tried to allocate 5.82 GiB."
    assert first_line(MemoryError()) == ""
