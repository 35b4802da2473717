"""SpecError: one message shape that names the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from difftest.errors import SpecError, require


def test_message_names_field_value_and_expectation():
    err = SpecError("next_n", 0, "an integer >= 1")
    assert (err.field, err.value, err.expected) == ("next_n", 0, "an integer >= 1")
    assert str(err) == "next_n=0: expected an integer >= 1"
    assert isinstance(err, ValueError), "callers catching ValueError still see it"


def test_require():
    require(True, "x", 1, "anything")
    with pytest.raises(SpecError, match=r"^lengths=\(-1,\): expected every length >= 0$"):
        require(False, "lengths", (-1,), "every length >= 0")
