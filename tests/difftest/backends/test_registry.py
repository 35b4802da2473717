"""The backend registry: names, module paths, factories, decorated functions, and clear errors."""

from __future__ import annotations

import pytest

from difftest.backends import BUILTIN, Backend, as_backend, available_names, get_backends, load_backend
from difftest.backends.torch_ref import TorchBackend
from difftest.errors import SpecError
from tests import user_backends as ub


def test_torch_is_builtin_and_loads():
    assert BUILTIN["torch"] == "difftest.backends.torch_ref:TorchBackend"
    assert "torch" in available_names()
    (torch_backend,) = get_backends(["torch"])
    assert isinstance(torch_backend, TorchBackend) and isinstance(torch_backend, Backend)
    assert torch_backend.name == "torch" and torch_backend.unavailable_reason("cpu") is None


def test_unknown_backend_name_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        get_backends(["torch", "nope", "also-nope"])
    err = info.value
    assert (err.field, err.value) == ("--backends", "nope,also-nope"), f"{err}"
    assert "torch" in err.expected, f"{err.expected=}"


@pytest.mark.parametrize("target, kind", [
    ("tests.user_backends:per_sequence_reader", "decorated function"),
    ("tests.user_backends:make_per_sequence_reader", "factory"),
    ("tests.user_backends:LeavesLastRowUnwritten", "class"),
])
def test_load_backend_from_module_path(target, kind):
    loaded = load_backend(target)
    assert isinstance(loaded, Backend), f"{kind}: {loaded=}"
    assert loaded.contract is not None and loaded.name, f"{kind}: {loaded=}"


def test_get_backends_appends_module_backends():
    loaded = get_backends(["torch"], ("tests.user_backends:sequence_length_for_every_row",))
    assert [b.name for b in loaded] == ["torch", "sequence_length_for_every_row"], f"{loaded=}"


def test_as_backend_keeps_an_instance():
    instance = ub.LeavesLastRowUnwritten()
    assert as_backend(instance, "--backend-module", "x") is instance


@pytest.mark.parametrize("target, expected_part", [
    ("no_colon_here", "'package.module:object'"),
    ("tests.no_such_module:fn", "an importable module"),
    ("tests.user_backends:missing", "an object named 'missing'"),
    ("tests.user_backends:PER_ROW", "a Backend, a factory of one"),
    ("tests.user_backends:logits_with_limits", "a Backend, a factory of one"),
])
def test_bad_module_path_is_a_spec_error(target, expected_part):
    with pytest.raises((SpecError, TypeError)) as info:
        load_backend(target)
    assert isinstance(info.value, SpecError), f"{target}: {type(info.value).__name__}: {info.value}"
    assert info.value.field == "--backend-module" and info.value.value == target, f"{info.value}"
    assert expected_part in info.value.expected, f"{info.value.expected=}"
