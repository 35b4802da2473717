"""The backend registry: names, module paths, the working directory, origins, rebuilds, and errors
that name the `backends` parameter."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import pickle
import sys
import textwrap

import pytest

from difftest.backends import (
    BUILTIN_MODULES,
    Backend,
    Loaded,
    Origin,
    as_backend,
    as_loaded,
    available_names,
    builtin_backends,
    get_backends,
    load_backend,
    load_of_any_operation,
    load_operation_backend,
    load_operation_registered,
    operation_names,
    origin_of,
    rebuild,
)
from difftest.backends import registry as reg
from difftest.backends.torch_ref import TorchBackend
from difftest.backends.torch_topk import TorchTopk
from difftest.backends.user import FunctionBackend, backend
from difftest.core.errors import SpecError
from difftest.core.indexer import IndexerContract
from difftest.core.kinds import OperationKind
from tests import broken_backends as bb
from tests import user_backends as ub

BUILTIN_NAMES = (
    "torch", "deepgemm", "deepgemm-flattened", "deepgemm-varlen", "deepgemm-bf16-logits",
    "aiter-triton-stage1", "aiter-triton-fused", "aiter-triton-stage1-ragged", "aiter-triton-fused-ragged",
    "aiter-rocm-stage1", "aiter-rocm-fused", "aiter-rocm-stage1-ragged", "aiter-rocm-fused-ragged",
    "vllm-torch-ref", "vllm-triton-decode", "vllm-deepgemm", "vllm-step5", "vllm-step5-paired",
    "sglang-torch-ref", "sglang-tilelang", "flashinfer", "flashinfer-ref", "deepgemm-flaggems-schedule",
)


# --------------------------------------------------------------------------- names

def test_builtin_names_come_from_the_modules_tables_in_order():
    assert tuple(builtin_backends()) == BUILTIN_NAMES
    names = available_names()
    assert tuple(names)[:len(BUILTIN_NAMES)] == BUILTIN_NAMES
    assert names["torch"] == "difftest.backends.torch_ref (built in)"
    assert names["aiter-rocm-fused"] == "difftest.backends.aiter_rocm (built in)"
    tables = [importlib.import_module(m).BACKENDS for m in BUILTIN_MODULES]
    assert sum(len(t) for t in tables) == len(BUILTIN_NAMES), "a name is in two tables"


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_builtin_name_loads_a_backend_of_that_name(name):
    loaded = load_backend(name)
    assert isinstance(loaded, Loaded) and isinstance(loaded, Backend)
    assert isinstance(loaded.backend, Backend) and not isinstance(loaded.backend, Loaded)
    assert loaded.name == name == loaded.backend.name
    assert loaded.origin == Origin(name, registered=True)


def test_listing_imports_no_kernel_library():
    """The tables build their backends lazily: naming them costs no kernel import."""
    before = {m for m in ("aiter", "triton", "vllm", "deep_gemm") if m in sys.modules}
    available_names()
    builtin_backends()
    after = {m for m in ("aiter", "triton", "vllm", "deep_gemm") if m in sys.modules}
    assert after == before


def test_torch_loads_and_delegates():
    (torch_backend,) = get_backends(["torch"])
    assert isinstance(torch_backend.backend, TorchBackend) and isinstance(torch_backend, Backend)
    assert torch_backend.contract == TorchBackend.contract
    assert torch_backend.unavailable_reason("cpu") is None


def test_get_backends_of_none_is_every_registered_one():
    assert tuple(b.name for b in get_backends()) == tuple(available_names())


def test_entry_point_backends_are_registered(monkeypatch):
    point = importlib.metadata.EntryPoint("planted", "tests.user_backends:per_sequence_reader",
                                          reg.ENTRY_POINT_GROUP)
    shadow = importlib.metadata.EntryPoint("torch", "tests.user_backends:window_one_short", reg.ENTRY_POINT_GROUP)
    monkeypatch.setattr(reg, "_entry_points", lambda: {"planted": point, "torch": shadow})
    assert available_names()["planted"] == "tests.user_backends:per_sequence_reader (entry point difftest.backends)"
    assert available_names()["torch"].endswith("(built in)"), "a package cannot replace a built-in name"
    loaded = load_backend("planted")
    assert loaded.name == "per_sequence_reader" and loaded.origin == Origin("planted", registered=True)
    assert rebuild(loaded.origin).backend.fn is ub.per_sequence_reader


# --------------------------------------------------------------------------- module paths

@pytest.mark.parametrize("target, kind", [
    ("tests.user_backends:per_sequence_reader", "decorated function"),
    ("tests.user_backends:make_per_sequence_reader", "factory"),
    ("tests.user_backends:LeavesLastRowUnwritten", "class"),
])
def test_load_backend_from_module_path(target, kind):
    loaded = load_backend(target)
    assert isinstance(loaded, Loaded) and isinstance(loaded.backend, Backend), f"{kind}: {loaded=}"
    assert loaded.origin == Origin(target, registered=False), kind


def test_get_backends_mixes_names_and_module_paths_in_order():
    loaded = get_backends(["tests.user_backends:sequence_length_for_every_row", "torch"])
    assert [b.name for b in loaded] == ["sequence_length_for_every_row", "torch"], f"{loaded=}"
    assert [b.origin.registered for b in loaded] == [False, True]


def test_a_dotted_object_path_loads():
    loaded = load_backend("tests.difftest.backends.test_registry:Holder.made")
    assert loaded.name == "torch" and loaded.origin.target == "tests.difftest.backends.test_registry:Holder.made"


class Holder:
    made = TorchBackend()


KERNEL_FILE = """
from difftest.backends.user import backend
from tests.user_backends import PER_ROW, logits_with_limits

@backend(contract=PER_ROW, name="from-cwd")
def mine(q, kv_cache, weights, context_lens, block_table, max_model_len):
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
"""


@pytest.fixture
def in_a_folder_off_sys_path(tmp_path, monkeypatch):
    """The working directory is tmp_path, which is not on sys.path; tests/ stays importable."""
    repo = os.getcwd()
    monkeypatch.syspath_prepend(repo)  # `tests.user_backends` stays importable from tmp_path
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("cwd_kernels_for_registry_test", None)


def test_a_module_in_the_working_directory_loads_without_staying_on_sys_path(in_a_folder_off_sys_path):
    (in_a_folder_off_sys_path / "cwd_kernels_for_registry_test.py").write_text(textwrap.dedent(KERNEL_FILE))
    before = list(sys.path)
    loaded = load_backend("cwd_kernels_for_registry_test:mine")
    assert loaded.name == "from-cwd"
    assert loaded.origin == Origin("cwd_kernels_for_registry_test:mine", registered=False)
    assert sys.path == before, "the working directory is added for that import only"


def test_an_import_error_names_the_path_searched(in_a_folder_off_sys_path):
    with pytest.raises(SpecError) as info:
        load_backend("no_such_module_anywhere:fn", "backends")
    err = info.value
    assert (err.field, err.value) == ("backends", "no_such_module_anywhere:fn")
    assert "an importable module" in err.expected and "sys.path searched" in err.expected
    assert os.getcwd() in err.expected, "the working directory was searched too"


@pytest.mark.parametrize("target, expected_part", [
    ("no_colon_here", "a registered name among"),
    (":fn", "'package.module:object'"),
    ("tests.no_such_module:fn", "an importable module"),
    ("tests.user_backends:missing", "an object named 'missing'"),
    ("tests.user_backends:PER_ROW", "a Backend, a factory of one"),
    ("tests.user_backends:logits_with_limits", "a Backend, a factory of one"),
])
def test_bad_targets_are_spec_errors_naming_the_field(target, expected_part):
    with pytest.raises(SpecError) as info:
        load_backend(target)
    assert (info.value.field, info.value.value) == ("backend", target), f"{info.value}"
    assert expected_part in info.value.expected, f"{info.value.expected=}"


# --------------------------------------------------------------------------- errors name `backends`

def test_unknown_names_are_reported_together_under_backends():
    with pytest.raises(SpecError) as info:
        get_backends(["torch", "nope", "also-nope"])
    err = info.value
    assert (err.field, err.value) == ("backends", "nope,also-nope"), f"{err}"
    assert "torch" in err.expected and "--" not in err.field, f"{err.expected=}"


def test_a_bad_module_path_in_the_list_is_reported_under_backends():
    with pytest.raises(SpecError) as info:
        get_backends(["torch", "tests.user_backends:missing"])
    assert (info.value.field, info.value.value) == ("backends", "tests.user_backends:missing")


def test_one_string_is_not_a_list_of_names():
    with pytest.raises(SpecError) as info:
        get_backends("torch")  # type: ignore[arg-type]
    assert info.value.field == "backends" and "a list" in info.value.expected


# --------------------------------------------------------------------------- objects and origins

def test_as_loaded_keeps_a_loaded_and_finds_origins_of_objects():
    loaded = load_backend("torch")
    assert as_loaded(loaded) is loaded
    assert as_loaded(TorchBackend()).origin == Origin("torch", registered=True)
    assert as_loaded(TorchBackend).origin == Origin("torch", registered=True)
    assert as_loaded(ub.per_sequence_reader).origin == Origin("tests.user_backends:per_sequence_reader", False)
    # The factory makes exactly what the decorated function's own path rebuilds.
    assert as_loaded(ub.make_per_sequence_reader).origin == Origin("tests.user_backends:per_sequence_reader", False)
    assert as_loaded(ub.LeavesLastRowUnwritten()).origin == Origin("tests.user_backends:LeavesLastRowUnwritten", False)


def test_as_loaded_refuses_what_is_no_backend():
    with pytest.raises(SpecError) as info:
        as_loaded(ub.logits_with_limits, "backends")
    assert info.value.field == "backends" and info.value.value == "tests.user_backends:logits_with_limits"


def test_origin_of_a_backend_changed_after_it_was_made_is_none():
    changed = FunctionBackend.from_function(bb.raises)
    changed = type(changed)(name="renamed", contract=changed.contract, fn=changed.fn)
    origin = origin_of(changed)
    assert origin.target is None and not origin.registered
    assert origin.why_not == "tests.broken_backends:raises builds a different backend (this one was changed " \
                             "after it was made)", origin.why_not
    assert origin.describe().startswith("cannot be rebuilt in a fresh process: ")


def test_origin_of_a_local_function_says_a_fresh_process_cannot_import_it():
    @backend(contract=ub.PER_ROW)
    def local(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return q

    origin = as_loaded(local).origin
    assert origin.target is None
    assert "which a fresh process cannot import" in origin.why_not and "<locals>" in origin.why_not


def test_the_hint_is_tried_first_and_only_a_target_that_rebuilds_counts():
    strict = bb.strict_raises()
    assert origin_of(strict, "tests.broken_backends:strict_raises") == \
        Origin("tests.broken_backends:strict_raises", False)
    assert as_loaded(bb.strict_raises).origin == Origin("tests.broken_backends:strict_raises", False)
    why = origin_of(strict, "tests.broken_backends:raises").why_not
    assert why.startswith("tests.broken_backends:raises builds a different"), why


def test_a_target_whose_factory_raises_is_reported_not_raised(monkeypatch):
    def boom():
        raise RuntimeError("factory exploded")

    @backend(contract=ub.PER_ROW)
    def local(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return q

    monkeypatch.setattr(ub, "exploding_factory", boom, raising=False)
    origin = origin_of(FunctionBackend.from_function(local), "tests.user_backends:exploding_factory")
    assert origin == Origin(None, False, "tests.user_backends:exploding_factory does not load: "
                                         "backend='tests.user_backends:exploding_factory': expected a factory "
                                         "that returns a Backend; calling it raised RuntimeError: factory exploded"), \
        origin
    assert origin_of(TorchBackend(), "tests.user_backends:exploding_factory") == Origin("torch", registered=True)


# --------------------------------------------------------------------------- rebuild

@pytest.mark.parametrize("target", ["torch", "aiter-triton-fused", "deepgemm-varlen",
                                    "tests.user_backends:per_sequence_reader",
                                    "tests.user_backends:LeavesLastRowUnwritten"])
def test_rebuild_makes_an_equal_backend_with_the_same_origin(target):
    loaded = load_backend(target)
    again = rebuild(loaded.origin)
    assert again is not loaded and again.origin == loaded.origin
    assert type(again.backend) is type(loaded.backend) and again.name == loaded.name
    assert again.contract == loaded.contract


def test_rebuild_of_an_origin_without_target_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        rebuild(Origin(None, False, "defined in a notebook"))
    assert "defined in a notebook" in info.value.expected


def test_origins_describe_themselves():
    assert Origin("torch", True).describe() == "registered backend 'torch'"
    assert Origin("pkg.mod:fn", False).describe() == "imported from 'pkg.mod:fn'"


def test_as_backend_unwraps_and_keeps_instances():
    instance = ub.LeavesLastRowUnwritten()
    assert as_backend(instance, "backend", "x") is instance
    assert as_backend(as_loaded(instance), "backend", "x") is instance


def test_a_user_backend_is_named_as_it_calls_itself_once_its_path_is_given():
    target = "tests.user_backends:mirrored_mtp_window"
    loaded = get_backends(["torch", "mirrored-mtp-window", target])
    assert [b.name for b in loaded] == ["torch", "mirrored-mtp-window"], f"{loaded=}"
    assert loaded[1].origin.target == target


def test_a_user_backends_name_without_its_path_is_unknown():
    with pytest.raises(SpecError) as raised:
        get_backends(["mirrored-mtp-window"])
    message = str(raised.value)
    assert raised.value.value == "mirrored-mtp-window" and "the name of a backend such a path loads" in message


# --------------------------------------------------------------------------- every operation

RIGHT_RAGGED = "tests.difftest.operations.planted:OracleRagged"
WHOLE_ROW_TOPK = "tests.difftest.operations.planted:WholeRowTopk"


@pytest.mark.parametrize(("kind", "target", "name", "registered"), [
    (OperationKind.TOPK, "torch-topk", "torch-topk", True),
    (OperationKind.TOPK, WHOLE_ROW_TOPK, "planted-whole-row-topk", False),
    (OperationKind.RAGGED_LOGITS, "vllm-torch-ref-ragged", "vllm-torch-ref-ragged", True),
    (OperationKind.RAGGED_LOGITS, RIGHT_RAGGED, "planted-right-ragged", False),
    (OperationKind.PAGED_LOGITS, "tests.user_backends:per_sequence_reader", "per_sequence_reader", False),
    (OperationKind.INDEXER, "torch+torch-topk", "torch+torch-topk", True),
    (OperationKind.INDEXER, f"torch+{WHOLE_ROW_TOPK}", "torch+planted-whole-row-topk", False),
    (OperationKind.PREFILL_INDEXER, f"{RIGHT_RAGGED}+torch-topk", "planted-right-ragged+torch-topk", False),
])
def test_every_operation_loads_a_registered_name_or_a_module_path_with_the_origin_that_rebuilds_it(kind, target, name,
                                                                                                   registered):
    loaded = load_operation_backend(kind, target)
    assert loaded.name == name and loaded.contract.operation == kind
    assert loaded.origin == Origin(target, registered=registered)
    assert load_operation_backend(kind, loaded.origin.target).name == name


@pytest.mark.parametrize(("kind", "target", "wanted", "belongs"), [
    (OperationKind.TOPK, RIGHT_RAGGED, "topk", "ragged-logits"),
    (OperationKind.RAGGED_LOGITS, "torch-topk", "ragged-logits", None),  # another operation's name is no name here
    (OperationKind.PAGED_LOGITS, WHOLE_ROW_TOPK, "paged-logits", "topk"),
    # a composition's half: the operation of its stage
    (OperationKind.INDEXER, f"{RIGHT_RAGGED}+torch-topk", "paged-logits", "ragged-logits"),
    (OperationKind.PREFILL_INDEXER, f"{RIGHT_RAGGED}+{RIGHT_RAGGED}", "topk", "ragged-logits"),
])
def test_a_backend_of_another_operation_is_one_error_naming_the_operation_it_belongs_to(kind, target, wanted,
                                                                                        belongs):
    with pytest.raises(SpecError) as raised:
        load_operation_backend(kind, target)
    assert raised.value.field == "backends" and f"a backend of the {wanted} operation" in raised.value.expected
    assert belongs is None or f"is a backend of the {belongs} operation" in raised.value.expected


def test_a_composition_is_two_halves_joined_by_one_plus():
    with pytest.raises(SpecError, match="'LOGITS\\+TOPK'"):
        load_operation_backend(OperationKind.INDEXER, "torch+torch-topk+torch-topk")
    with pytest.raises(SpecError, match="'LOGITS\\+TOPK'"):
        load_operation_backend(OperationKind.INDEXER, "torch+")


def test_a_registered_origin_of_any_operation_imports_no_module_path():
    for kind, target in ((OperationKind.TOPK, WHOLE_ROW_TOPK), (OperationKind.INDEXER, f"torch+{WHOLE_ROW_TOPK}")):
        with pytest.raises(SpecError, match="a registered name"):
            load_operation_registered(kind, target)


def test_an_indexers_path_stages_are_named_in_compositions_by_their_own_names_and_not_run_alone():
    loaded = get_backends([WHOLE_ROW_TOPK, "torch+planted-whole-row-topk", "torch+torch-topk"],
                          kind=OperationKind.INDEXER)
    assert [b.name for b in loaded] == ["torch+planted-whole-row-topk", "torch+torch-topk"]
    assert loaded[0].origin == Origin(f"torch+{WHOLE_ROW_TOPK}", registered=False)
    with pytest.raises(SpecError, match="its stages are named as 'LOGITS\\+TOPK'"):
        get_backends([WHOLE_ROW_TOPK], kind=OperationKind.INDEXER)


def test_an_operations_default_backends_are_its_built_in_ones():
    assert [b.name for b in get_backends(None, kind=OperationKind.TOPK)] == list(operation_names(OperationKind.TOPK))


def test_an_entry_point_is_a_backend_of_the_operation_its_contract_declares(monkeypatch):
    point = importlib.metadata.EntryPoint("ragged-plugin", RIGHT_RAGGED, reg.ENTRY_POINT_GROUP)
    monkeypatch.setattr(reg, "_entry_points", lambda: {point.name: point})
    loaded = load_operation_backend(OperationKind.RAGGED_LOGITS, "ragged-plugin")
    assert loaded.name == "planted-right-ragged" and loaded.origin == Origin("ragged-plugin", registered=True)
    with pytest.raises(SpecError, match="ragged-plugin is a backend of the ragged-logits operation"):
        load_operation_backend(OperationKind.TOPK, "ragged-plugin")


def test_a_template_of_any_operation_loads_by_name_or_path():
    assert load_of_any_operation("torch-topk").contract.operation == OperationKind.TOPK
    assert load_of_any_operation("torch").contract.operation == OperationKind.PAGED_LOGITS
    assert load_of_any_operation(RIGHT_RAGGED).origin == Origin(RIGHT_RAGGED, registered=False)
    with pytest.raises(SpecError, match="a backend of one of the operations"):
        load_of_any_operation(f"{__name__}:WholeIndexer")  # an indexer is no template: its stages are


class WholeIndexer:
    """A pipeline in one object: a backend of the indexer operation."""

    name = "whole-indexer"
    contract = IndexerContract(TorchBackend.contract, TorchTopk.contract)

    def unavailable_reason(self, device: str) -> None:
        return None

    def __call__(self, inputs: object, out: object) -> None:
        raise NotImplementedError  # never called: only loaded


def test_a_backend_loaded_from_a_path_travels_to_a_worker_as_its_path_and_a_registered_one_as_itself():
    imported = load_operation_backend(OperationKind.TOPK, WHOLE_ROW_TOPK)
    again = pickle.loads(pickle.dumps(imported))
    assert again.origin == imported.origin and again.backend is not imported.backend and again.name == imported.name
    registered = load_operation_backend(OperationKind.INDEXER, "torch+torch-topk")
    assert pickle.loads(pickle.dumps(registered)).origin == registered.origin


def test_an_object_of_any_operation_gets_the_origin_that_rebuilds_it_in_its_operation():
    assert as_loaded(TorchTopk()).origin == Origin("torch-topk", registered=True)
    assert as_loaded(reg.load_operation_backend(OperationKind.TOPK, WHOLE_ROW_TOPK).backend).origin \
        == Origin(WHOLE_ROW_TOPK, registered=False)
