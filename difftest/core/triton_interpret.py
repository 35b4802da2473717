"""Triton kernels on the CPU: loading a kernel file in interpreted or compiled mode, and the shims
the interpreter needs when the same process also compiles Triton kernels for a GPU.

`triton.jit` decides between an InterpretedFunction and a JITFunction when the decorator runs, so a
kernel file is executed once per mode (load_kernel_module), each time as a module object of its own,
with TRITON_INTERPRET set only while it executes. Launches of interpreted kernels go inside
interpreter_compat().
"""

from __future__ import annotations

import ast
import contextlib
import dis
import enum
import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import numpy as np

_LOADED: dict[tuple[str, bool], ModuleType] = {}
_MISSING = object()


@contextlib.contextmanager
def environ(name: str, value: str) -> Iterator[None]:
    """`os.environ[name] = value` for the duration of the block only."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def load_kernel_module(path: Path, name: str, interpret: bool) -> ModuleType:
    """The Triton kernel file at `path` as a module named `name`-interpreted or -compiled; cached.

    Triton itself (and gluon, imported lazily at the first launch) is imported first, without the
    variable, so its standard library stays compiled-mode for GPU launches in the same process.
    """
    key = (str(path), interpret)
    if key in _LOADED:
        return _LOADED[key]
    _import_triton()
    full_name = f"{name}_{'interpreted' if interpret else 'compiled'}"
    spec = importlib.util.spec_from_file_location(full_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with environ("TRITON_INTERPRET", "1" if interpret else "0"):
        spec.loader.exec_module(module)
    sys.modules[full_name] = module
    _LOADED[key] = module
    return module


def load_kernel_defs(path: Path, names: tuple[str, ...], name: str, interpret: bool,
                     namespace: dict[str, Any]) -> ModuleType:
    """The top-level functions `names` of the file at `path`, executed verbatim (decorators included)
    in a module named `name`-interpreted or -compiled whose globals start as `namespace`; cached.

    For a kernel file whose own imports cannot run here (a module of a large package that is not
    installed): nothing else of the file runs, and `namespace` supplies the names those functions
    use. The code keeps the file's name and line numbers, so triton.jit reads each kernel's source
    from the file itself. LookupError when the file lacks one of `names`.
    """
    key = (f"{path}::{','.join(names)}", interpret)
    if key in _LOADED:
        return _LOADED[key]
    _import_triton()
    tree = ast.parse(path.read_text(), str(path))
    found = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"{path} defines no {', '.join(missing)}")
    full_name = f"{name}_{'interpreted' if interpret else 'compiled'}"
    module = ModuleType(full_name)
    module.__file__ = str(path)
    module.__dict__.update(namespace)
    code = compile(ast.Module([found[n] for n in names], type_ignores=[]), str(path), "exec")
    sys.modules[full_name] = module  # inspect (called by triton.jit) finds a function's module here
    with environ("TRITON_INTERPRET", "1" if interpret else "0"):
        exec(code, module.__dict__)
    _LOADED[key] = module
    return module


def global_names(function: Callable[..., Any]) -> set[str]:
    """The global names `function` reads, nested code included; through a @triton.jit kernel or a
    functools decorator to the Python function inside."""
    code = inspect.unwrap(getattr(function, "fn", function)).__code__
    names: set[str] = set()
    pending = [code]
    while pending:
        current = pending.pop()
        names.update(i.argval for i in dis.get_instructions(current) if i.opname == "LOAD_GLOBAL")
        pending.extend(c for c in current.co_consts if isinstance(c, CodeType))
    return names


def _import_triton() -> None:
    """Triton (and gluon, imported lazily at the first launch) imported without TRITON_INTERPRET, so
    its standard library stays compiled-mode for GPU launches in the same process."""
    importlib.import_module("triton.language")
    with contextlib.suppress(ImportError):
        importlib.import_module("triton.experimental.gluon")


def _snapshot(objects: tuple[object, ...]) -> list[tuple[object, dict[str, object]]]:
    return [(obj, dict(vars(obj))) for obj in objects]


def _restore(snapshot: list[tuple[object, dict[str, object]]]) -> None:
    """Put every attribute back as it was; drop those added since (submodules excepted)."""
    for obj, before in snapshot:
        now = dict(vars(obj))
        for name, value in now.items():
            if name not in before and not isinstance(value, ModuleType):
                delattr(obj, name)
        for name, value in before.items():
            if now.get(name, _MISSING) is not value:
                setattr(obj, name, value)


@contextlib.contextmanager
def interpreter_compat() -> Iterator[None]:
    """Let interpreted kernels run in a process whose Triton was imported in compiled mode.

    Three things stand in the way, all in Triton's machinery, none in the kernel:
    * tl.cdiv and the rest of Triton's standard library are JITFunctions, which the interpreter
      refuses to call; they are swapped for InterpretedFunctions of the same Python code.
    * The interpreter turns a scalar into a Python int with int() of a 1-element 1-D array, which
      numpy >= 2.4 rejects (`range(...)` over loaded lengths fails); .item() does the same job.
    * An interpreted device-function call (tl.cdiv, a kernel's own combine function) patches
      triton.language's builtins with numpy ones and never restores them, which breaks every
      later GPU compile in the process ("'block_argument' object has no attribute 'dtype'").
    Everything the interpreter may patch is snapshotted before and put back on exit.

    One more swap is for speed alone: a reduction with a kernel's own combine function (AITER's
    fused kernels sum heads with one) makes the interpreter call that function once per element, in
    Python. `_folded_reduce` performs the same left fold along the axis, in the same order and with
    the same casts, once per position along it on whole slices, which for an elementwise combine
    function is the same arithmetic (tests/difftest/test_triton_interpret.py checks bit-equality).
    """
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    patched = (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.tensor_descriptor_base)
    snapshot = _snapshot(patched)
    swapped = [(module, name, fn) for module in (tl, tl.standard)
               for name, fn in list(vars(module).items()) if isinstance(fn, JITFunction)]
    original_patch = interpreter._patch_lang_tensor
    original_reduce = interpreter.ReduceOps.generic_reduce

    def patch_lang_tensor(tensor: type, scope: interpreter._LangPatchScope) -> None:
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    try:
        for module, name, fn in swapped:
            setattr(module, name, interpreter.InterpretedFunction(fn.fn))
        interpreter._patch_lang_tensor = patch_lang_tensor
        interpreter.ReduceOps.generic_reduce = functools.partialmethod(_folded_reduce, original_reduce)
        yield
    finally:
        interpreter.ReduceOps.generic_reduce = original_reduce
        interpreter._patch_lang_tensor = original_patch
        for module, name, fn in swapped:
            setattr(module, name, fn)
        _restore(snapshot)


def _folded_reduce(self: Any, stock: Callable[..., list[Any]], inputs: tuple[Any, ...]) -> list[Any]:
    """The interpreter's generic reduction (ReduceOps.generic_reduce), one combine call per slice.

    The stock loop visits every element in C order and folds it into its output position:
    acc = x[0]; acc = combine(acc, x[k]) for k = 1.. along the axis, storing acc in the input's
    dtype after each step. Here the same fold runs on the slices x[k] of every output position at
    once. An empty axis gives the stock loop's zero-filled output. A whole-tensor reduction of
    several inputs stays with the stock loop, which flattens only the first of them.
    """
    original_axis = self.axis
    if original_axis is None and len(inputs) > 1:
        return stock(self, inputs)
    inputs, axis = self.unravel(inputs, self.axis)
    arrays = [np.moveaxis(arg.handle.data, axis, 0) for arg in inputs]
    rest = arrays[0].shape[1:]
    dtypes = [arg.dtype for arg in inputs]
    if arrays[0].shape[0] == 0:
        return [self.to_tensor(_packed(self, np.zeros(rest, a.dtype), axis, original_axis, a.ndim), d)
                for a, d in zip(arrays, dtypes, strict=True)]

    def slices(k: int) -> list[Any]:  # x[k] of every input, as blocks (1-element ones for scalars)
        return [self.to_tensor(a[k].reshape(rest or (1,)), dtype) for a, dtype in zip(arrays, dtypes, strict=True)]

    accs = slices(0)
    for k in range(1, arrays[0].shape[0]):
        out = self.combine_fn.fn(*accs, *slices(k))
        out = out if isinstance(out, tuple) else (out,)
        accs = [self.to_tensor(_stored(o, a.dtype, rest), d) for o, a, d in zip(out, arrays, dtypes, strict=True)]
    return [self.to_tensor(_packed(self, acc.handle.data.reshape(rest), axis, original_axis, arrays[0].ndim), d)
            for acc, d in zip(accs, dtypes, strict=True)]


def _stored(value: Any, dtype: Any, rest: tuple[int, ...]) -> Any:
    """A combine result as the stock loop stores it: cast to the input's dtype, full slice shape."""
    data = value.handle.data if hasattr(value, "handle") else value
    return np.broadcast_to(np.asarray(data).astype(dtype), rest or (1,)).copy()


def _packed(self: Any, data: Any, axis: int, original_axis: int | None, ndim: int) -> Any:
    """The stock loop's output packing: keep_dims expands, a whole-tensor reduction is a scalar."""
    if self.keep_dims:
        if original_axis is not None:
            return np.expand_dims(data, axis)
        return data.reshape((1,) * ndim)
    return data.item() if original_axis is None else data


class Landing(enum.Enum):
    """When a store one program made into a later program's bytes lands (late_cross_program_stores)."""

    FIRST_READ = "first-read"  # just before the owner first loads from its bytes (after writing them)
    REREAD = "reread"  # just before the owner loads bytes of its own a second time: two reads of them disagree
    END = "end"  # after the launch: for bytes the owner only writes


@contextlib.contextmanager
def late_cross_program_stores(base: int, span: int, programs: int,
                              landing: Landing = Landing.FIRST_READ) -> Iterator[None]:
    """Under the interpreter, one GPU schedule of a kernel whose programs write into each other's memory.

    Program q < `programs` owns the bytes [base + q * span, base + (q + 1) * span). The interpreter runs a grid's
    programs one after another, so a store program p makes into a later program q's bytes is overwritten
    when q writes them itself: what a GPU shows only if p's store lands first. Here it lands late: every
    such store is recorded and replayed, in order, at the point of q's run that `landing` names, or when the
    block ends if q never reaches it. On a GPU, where the programs run at once, each is an order the hardware
    may pick. Stores a program makes into its own bytes, or outside every program's (another buffer, a guard:
    replaying them would put an old value over a newer one), are untouched.
    """
    from triton.runtime import interpreter  # deferred: with the interpreter only

    builder = interpreter.InterpreterBuilder
    stock_store, stock_load = builder.create_masked_store, builder.create_masked_load
    pending: list[tuple[int, np.ndarray, np.ndarray]] = []  # (program, addresses, values) of stores into later ones
    read: dict[int, np.ndarray] = {}  # the addresses of its own bytes each program has loaded
    replayed: set[int] = set()

    def owner(addresses: np.ndarray) -> np.ndarray:
        owners = (addresses.astype(np.int64) - base) // span
        return np.where((owners >= 0) & (owners < programs), owners, -1)  # -1: no program's bytes

    def replay(program: int) -> None:
        replayed.add(program)
        for writer, addresses, values in pending:
            mine = owner(addresses) == program
            if writer < program and mine.any():
                interpreter._interpreter.store(addresses[mine], values[mine], np.ones(int(mine.sum()), bool))

    def store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        program = self.grid_idx[0]
        later = mask.data & (owner(ptrs.data) > program)  # -1 (nobody's) is never later
        if later.any():
            pending.append((program, ptrs.data[later].copy(), value.data[later].copy()))
        return stock_store(self, ptrs, value, mask, *rest)

    def load(self: Any, ptrs: Any, mask: Any, *rest: Any) -> Any:
        program = self.grid_idx[0]
        mine = mask.data & (owner(ptrs.data) == program)
        if program not in replayed and landing != Landing.END and mine.any():
            before = read.get(program, np.empty(0, np.int64))
            if landing == Landing.FIRST_READ or np.isin(ptrs.data[mine], before).any():
                replay(program)
            read[program] = np.union1d(before, ptrs.data[mine].astype(np.int64))
        return stock_load(self, ptrs, mask, *rest)

    builder.create_masked_store, builder.create_masked_load = store, load
    try:
        yield
        for program in sorted({int(p) for _, addresses, _ in pending for p in owner(addresses)} - replayed):
            replay(program)
    finally:
        builder.create_masked_store, builder.create_masked_load = stock_store, stock_load
