"""The registry: names to backends, module paths to backends, and each backend's recorded origin, for every
operation.

Built-in paged-logits names come from the `BACKENDS` table of each module in BUILTIN_MODULES (name ->
zero-argument factory), the other operations' from difftest.backends.stages; other packages register theirs
under the one entry-point group `difftest.backends` (each object declares its operation through its contract's
`operation`); anything else loads from 'package.module:object'. An indexer operation also takes any
'LOGITS+TOPK' whose halves load as its logits stage's and top-k's backends. Every load records its Origin once,
so a worker or a replay rebuilds the same backend in a fresh process (`rebuild`, `load_operation_backend`).
"""

from __future__ import annotations

import copyreg
import functools
import importlib
import importlib.metadata
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from difftest.backends import stages
from difftest.backends.base import Backend, Loaded, Origin
from difftest.core.errors import SpecError, exception_text, require
from difftest.core.indexer import LOGITS_STAGE
from difftest.core.kinds import OperationKind

ENTRY_POINT_GROUP = "difftest.backends"
# Modules whose BACKENDS tables make the built-in names, in listing order. They import torch but no
# kernel library, so building the table costs no kernel import.
BUILTIN_MODULES = (
    "difftest.backends.torch_ref",
    "difftest.backends.deep_gemm",
    "difftest.backends.aiter_triton",
    "difftest.backends.aiter_rocm",
    "difftest.backends.vllm_indexer",
    "difftest.backends.vllm_step5",
    "difftest.backends.sglang",
    "difftest.backends.flashinfer",
    "difftest.backends.flag_gems",
)
_TARGET = "'package.module:object'"
# The operations a backend of one kernel is of (an indexer's are compositions of them), paged logits first.
STAGE_OPERATIONS = (OperationKind.PAGED_LOGITS, OperationKind.RAGGED_LOGITS, OperationKind.TOPK)
_DOTTED = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*")  # identifiers joined by dots: no relative import
_OWN_PACKAGES = ("difftest", "difftest_pytest")


# --------------------------------------------------------------------------- what can be loaded

@functools.cache
def _builtin() -> dict[str, tuple[str, Callable[[], Backend]]]:
    table: dict[str, tuple[str, Callable[[], Backend]]] = {}
    for module_name in BUILTIN_MODULES:
        for name, factory in importlib.import_module(module_name).BACKENDS.items():
            table[name] = (module_name, factory)
    return table


def builtin_backends() -> dict[str, Callable[[], Backend]]:
    """name -> zero-argument factory of every built-in backend."""
    return {name: factory for name, (_, factory) in _builtin().items()}


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def entry_point_backends() -> dict[str, str]:
    """name -> 'module:object' of backends other packages register under `difftest.backends`;
    a name that is also built in is left out (the built-in one wins)."""
    return {name: ep.value for name, ep in _entry_points().items() if name not in _builtin()}


def available_names() -> dict[str, str]:
    """Every registered name -> where it comes from, built-in first."""
    names = {name: f"{module} (built in)" for name, (module, _) in _builtin().items()}
    for name, value in entry_point_backends().items():
        names[name] = f"{value} (entry point {ENTRY_POINT_GROUP})"
    return names


def operation_names(kind: OperationKind) -> dict[str, Callable[[], Any]]:
    """name -> zero-argument factory of every built-in backend of the operation `kind` (an indexer's: its
    default compositions, difftest.backends.stages)."""
    if kind == OperationKind.PAGED_LOGITS:
        return builtin_backends()
    tables = {OperationKind.RAGGED_LOGITS: stages.ragged_backends, OperationKind.TOPK: stages.topk_backends}
    if kind in tables:
        return tables[kind]()
    compositions = stages.COMPOSITIONS if kind == OperationKind.INDEXER else stages.PREFILL_COMPOSITIONS
    return {c.name: functools.partial(_composed_of_names, kind, c.name) for c in compositions}


def _composed_of_names(kind: OperationKind, name: str) -> Any:
    return load_operation_backend(kind, name).backend


# --------------------------------------------------------------------------- loading

def load_backend(target: str, field: str = "backend") -> Loaded:
    """The paged-logits backend a registered name or 'package.module:object' names, with its origin.

    A module path is imported with the current working directory importable (as `python -m`
    would have it), so a kernel module in the folder difftest is run from loads without installing.
    """
    return load_operation_backend(OperationKind.PAGED_LOGITS, target, field)


def load_operation_backend(kind: OperationKind, target: str, field: str = "backends",
                           own: dict[str, Loaded] | None = None) -> Loaded:
    """The backend of operation `kind` that `target` names, with its origin: a registered name (built in, or an
    entry point), 'package.module:object' (a backend instance, a class or zero-argument factory of one, or a
    function decorated with difftest.backend(contract)), or, for an indexer operation, 'LOGITS+TOPK' whose halves
    are each of these (or a name in `own`: backends loaded by their own names). SpecError naming the operation
    a backend of another operation belongs to."""
    if kind in LOGITS_STAGE and "+" in target:
        return _composition(kind, target, field, lambda stage, half: load_operation_backend(stage, half, field, own))
    if own and target in own:
        loaded = own[target]
    elif ":" in target:
        loaded = Loaded(as_backend(_import_object(target, field), field, target), Origin(target, registered=False))
    else:
        loaded = load_operation_registered(kind, target, field, also=f", or {_TARGET}")
    _require_operation(kind, loaded.backend, field, target)
    return loaded


def load_of_any_operation(target: str, field: str = "backend") -> Loaded:
    """The backend `target` names, of whichever stage operation (paged logits, ragged logits, top-k) its contract
    declares: a registered name of one of them, or 'package.module:object' (a selftest's template)."""
    if ":" in target:
        loaded = Loaded(as_backend(_import_object(target, field), field, target), Origin(target, registered=False))
        require(_declared(loaded.backend) in STAGE_OPERATIONS, field, target, "a backend of one of the operations "
                f"{[k.value for k in STAGE_OPERATIONS]} (its contract declares which)")
        return loaded
    kind = next((k for k in STAGE_OPERATIONS[1:] if target in operation_names(k)), OperationKind.PAGED_LOGITS)
    return load_operation_registered(kind, target, field)


def load_operation_registered(kind: OperationKind, name: str, field: str = "backend", also: str = "") -> Loaded:
    """The backend of operation `kind` a registered name (an indexer's: 'LOGITS+TOPK' of two) names, with its
    origin; nothing but the registered backends' own modules is imported (see load_registered)."""
    if kind == OperationKind.PAGED_LOGITS:
        return load_registered(name, field, also)
    if kind in LOGITS_STAGE and "+" in name:
        return _composition(kind, name, field, lambda stage, half: load_operation_registered(stage, half, field))
    table = operation_names(kind) if kind not in LOGITS_STAGE else {}
    if name in table:
        return Loaded(table[name](), Origin(name, registered=True))
    points = _entry_points()
    if name not in points:
        raise SpecError(field, name, f"a backend of the {kind.value} operation: a registered name among "
                        f"{sorted(operation_names(kind))}, an entry point of {ENTRY_POINT_GROUP}{also}"
                        + (", or 'LOGITS+TOPK' of its two stages" if kind in LOGITS_STAGE else ""))
    loaded = Loaded(as_backend(_load_entry_point(points[name], field), field, name), Origin(name, registered=True))
    _require_operation(kind, loaded.backend, field, name)
    return loaded


def _composition(kind: OperationKind, target: str, field: str,
                 load: Callable[[OperationKind, str], Loaded]) -> Loaded:
    """'LOGITS+TOPK' as one backend of the indexer operation `kind`: each half loaded by `load` as its stage's
    backend; its origin the halves' targets joined the same way (registered when both are)."""
    logits_target, _, topk_target = target.partition("+")
    require(bool(logits_target) and bool(topk_target) and "+" not in topk_target, field, target,
            "'LOGITS+TOPK': a logits backend and a top-k backend joined by one '+'")
    logits, topk = load(LOGITS_STAGE[kind], logits_target), load(OperationKind.TOPK, topk_target)
    composed = stages.Composed(f"{logits.name}+{topk.name}", logits, topk)
    if logits.origin.target is None or topk.origin.target is None:
        why = "; ".join(o.why_not for o in (logits.origin, topk.origin) if o.target is None)
        return Loaded(composed, Origin(None, False, why))
    joined = f"{logits.origin.target}+{topk.origin.target}"
    return Loaded(composed, Origin(joined, registered=logits.origin.registered and topk.origin.registered))


def _require_operation(kind: OperationKind, backend: Any, field: str, target: str) -> None:
    """SpecError unless `backend`'s contract declares the operation `kind` (which one it does declare, if any)."""
    declared = _declared(backend)
    if declared == kind:
        return
    said = (f"{target} is a backend of the {declared.value} operation ({type(backend.contract).__name__})"
            if isinstance(declared, OperationKind) else
            f"{target}'s contract ({type(backend.contract).__name__}) declares no operation")
    raise SpecError(field, target, f"a backend of the {kind.value} operation: {said}")


def load_registered(name: str, field: str = "backend", also: str = "") -> Loaded:
    """The backend of a registered name (built in, or an installed package's entry point), with its
    origin; SpecError for any other text. Nothing but the registered backends' own modules is imported:
    a 'package.module:object' path is never a registered name, so a recorded origin that claims to be
    registered cannot import a module of its choosing (difftest.workflows.replay)."""
    if name in _builtin():
        return Loaded(_builtin()[name][1](), Origin(name, registered=True))
    points = _entry_points()
    if name not in points:
        raise SpecError(field, name, f"a registered name among {sorted(available_names())}{also}")
    return Loaded(as_backend(_load_entry_point(points[name], field), field, name), Origin(name, registered=True))


def get_backends(names: Sequence[str] | None = None, field: str = "backends",
                 kind: OperationKind = OperationKind.PAGED_LOGITS) -> list[Loaded]:
    """The backends of operation `kind` named, in order: each a registered name, 'package.module:object', the
    name of a backend that one of the 'package.module:object' entries loads (so a user backend can be named as
    it calls itself), or for an indexer 'LOGITS+TOPK' of two of these; each backend once. None means every
    registered one (of an operation other than paged logits: every built-in one; an entry point's operation is
    known only once it is loaded). Unknown names are reported together. An indexer's 'package.module:object'
    entry may be one of its stages (a logits or a top-k backend): not run alone, it is named in a
    'LOGITS+TOPK'."""
    if isinstance(names, str):  # a str is a Sequence of one-letter names: never what was meant
        raise SpecError(field, names, "a list of backend names, not one string")
    paged = kind == OperationKind.PAGED_LOGITS
    known = _registered_names(kind)
    chosen = list(known if paged else operation_names(kind)) if names is None else list(names)
    targets = {name: _path_target(kind, name, field) for name in chosen if ":" in name and "+" not in name}
    by_own_name = {loaded.name: loaded for loaded in targets.values()}
    unknown = [n for n in chosen if n not in known and ":" not in n and "+" not in n and n not in by_own_name]
    if unknown:
        whose = "" if paged else f" (of the {kind.value} operation, or its entry points)"
        raise SpecError(field, ",".join(unknown), f"registered names among {sorted(known)}{whose}, {_TARGET}, "
                        "or the name of a backend such a path loads")
    picked = [targets.get(n) or load_operation_backend(kind, n, field, by_own_name) for n in chosen]
    picked = [loaded for loaded in picked if _declared(loaded.backend) == kind]  # an indexer's stages stay out
    require(bool(picked) or not chosen, field, ",".join(chosen), f"a backend of the {kind.value} operation (its "
            "stages are named as 'LOGITS+TOPK')")
    return [loaded for i, loaded in enumerate(picked) if all(loaded is not p for p in picked[:i])]


def _registered_names(kind: OperationKind) -> dict[str, Any]:
    """Every name registered for operation `kind`: its built-in ones and (whatever their operation) the entry
    points'; an indexer's compositions of registered halves are registered too (_is_registered)."""
    return available_names() if kind == OperationKind.PAGED_LOGITS else {**operation_names(kind), **_entry_points()}


def _is_registered(kind: OperationKind, target: str) -> bool:
    """Whether `target` is a registered name of `kind` (an indexer's: both halves of 'LOGITS+TOPK' registered)."""
    if kind in LOGITS_STAGE and "+" in target:
        logits, _, topk = target.partition("+")
        return _is_registered(LOGITS_STAGE[kind], logits) and _is_registered(OperationKind.TOPK, topk)
    return ":" not in target and target in _registered_names(kind)


def _operation_of(backend: Backend) -> OperationKind:
    """The operation `backend` declares; paged logits for a contract that declares none (as before operations)."""
    declared = _declared(backend)
    return declared if isinstance(declared, OperationKind) else OperationKind.PAGED_LOGITS


def _path_target(kind: OperationKind, target: str, field: str) -> Loaded:
    """The backend 'package.module:object' loads for a run of operation `kind`: one of `kind`, or of one of its
    stages when `kind` is an indexer's."""
    stages_of = (LOGITS_STAGE[kind], OperationKind.TOPK) if kind in LOGITS_STAGE else ()
    loaded = Loaded(as_backend(_import_object(target, field), field, target), Origin(target, registered=False))
    if _declared(loaded.backend) not in stages_of:
        _require_operation(kind, loaded.backend, field, target)
    return loaded


def _declared(backend: Any) -> OperationKind | None:
    """The operation `backend`'s contract declares (None when it declares none)."""
    return getattr(backend.contract, "operation", None)


def as_loaded(obj: object, field: str = "backend") -> Loaded:
    """A Loaded from a Loaded (as is), a Backend instance, a class or zero-argument factory returning
    one, or a function decorated with difftest.backend(contract); its origin is the first of its
    registered name, its own class or function, and the factory that made it that rebuilds an
    equal backend (origin_of)."""
    if isinstance(obj, Loaded):
        return obj
    made_by = None if isinstance(obj, Backend) else _own_target(obj)
    backend = as_backend(obj, field, made_by or repr(obj))
    return Loaded(backend, _origin_among(backend, (_registered_name(backend), _own_target(_source(backend)), made_by)))


def as_backend(obj: object, field: str, target: str) -> Backend:
    """A Backend from an instance, a class or factory returning one, or a decorated function;
    SpecError(field, target, ...) for anything else."""
    from difftest.backends.user import CALLING_CONVENTIONS, FunctionBackend  # deferred: it imports torch

    if isinstance(obj, Loaded):
        return obj.backend
    if isinstance(obj, Backend) and not isinstance(obj, type):
        return obj
    if getattr(getattr(obj, "difftest_contract", None), "operation", None) in CALLING_CONVENTIONS:
        return FunctionBackend.from_function(obj)  # type: ignore[arg-type]
    if callable(obj) and _takes_no_arguments(obj):
        made = _made_by(obj, field, target)
        if isinstance(made, Backend) and not isinstance(made, type):
            return made.backend if isinstance(made, Loaded) else made
    raise SpecError(field, target, "a Backend, a factory of one, or a function decorated with "
                    "difftest.backend(contract=...)")


def _made_by(factory: Callable[[], object], field: str, target: str) -> object:
    """What `factory()` returns; SpecError naming `target` when it raises, a SystemExit (`sys:exit`)
    included: a factory ending the command would make it exit with a status it chose. A Ctrl-C while it
    runs stops the command as anywhere else."""
    try:
        return factory()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a factory can do anything; what it did is the error
        raise SpecError(field, target, "a factory that returns a Backend; calling it raised "
                        f"{exception_text(exc)}") from None


def rebuild(origin: Origin, field: str = "backend") -> Loaded:
    """The backend `origin` names, built afresh (in a worker, or for a replay)."""
    if origin.target is None:
        raise SpecError(field, None, f"an origin with a target ({origin.describe()})")
    return load_backend(origin.target, field)


def _reduced(loaded: Loaded) -> tuple[Any, ...]:
    """How a Loaded is pickled for a worker process (difftest.engine.isolate.OperationWorker): one imported from a
    module path travels as that path, imported afresh in the worker from the folder this process works in (the
    module need not be importable from the fork server's), as a paged worker rebuilds from its Origin; any other
    as itself. Registered with copyreg here, not as Loaded.__reduce__, so base.py never imports the registry."""
    if loaded.origin.target is None or loaded.origin.registered:
        return (Loaded, (loaded.backend, loaded.origin))
    return (rebuilt_in, (os.getcwd(), loaded.backend.contract.operation, loaded.origin))


def rebuilt_in(folder: str, kind: OperationKind, origin: Origin) -> Loaded:
    """In a fresh process (a worker): work in `folder` (the run's), then load the backend of operation `kind`
    that `origin` names, as the run loaded it."""
    os.chdir(folder)
    return load_operation_backend(kind, origin.target or "", "backend")


# --------------------------------------------------------------------------- origins of objects

def origin_of(backend: Backend, hint: str | None = None) -> Origin:
    """The first target that rebuilds a backend equal to `backend`: `hint` (where it was loaded
    from), its registered name, then its own class or function; else why none does."""
    if isinstance(backend, Loaded):
        return backend.origin
    return _origin_among(backend, (hint, _registered_name(backend), _own_target(_source(backend))))


def _origin_among(backend: Backend, candidates: tuple[str | None, ...]) -> Origin:
    tried = []
    for target in dict.fromkeys(t for t in candidates if t):
        why = _rebuild_difference(backend, target)
        if why is None:
            return Origin(target, registered=_is_registered(_operation_of(backend), target))
        tried.append(f"{target} {why}")
    if tried:
        return Origin(None, False, "; ".join(tried))
    source = _source(backend)
    where = f"{getattr(source, '__module__', None) or '?'}:{getattr(source, '__qualname__', '?')}"
    return Origin(None, False, f"{backend.name} is defined in {where}, which a fresh process cannot import")


def _registered_name(backend: Backend) -> str | None:
    return backend.name if _is_registered(_operation_of(backend), backend.name) else None


def _source(backend: Backend) -> object:
    """What defines `backend`: the decorated function of a FunctionBackend, else its class."""
    from difftest.backends.user import FunctionBackend  # deferred: it imports torch

    return backend.fn if isinstance(backend, FunctionBackend) else type(backend)


def _own_target(obj: object) -> str | None:
    """'module:qualname' of a class or function a fresh process can import, else None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return None
    return f"{module}:{qualname}"


def _rebuild_difference(backend: Backend, target: str) -> str | None:
    """How what `target` builds differs from `backend`, or None when it is the same backend."""
    try:
        again = load_operation_backend(_operation_of(backend), target, "backend").backend
    except Exception as exc:  # a factory may raise anything; the rebuild check reports it
        return f"does not load: {exc}" if isinstance(exc, SpecError) else \
            f"does not load: {type(exc).__name__}: {exc}"
    same = (type(again) is type(backend) and again.name == backend.name and again.contract == backend.contract
            and getattr(again, "fn", None) is getattr(backend, "fn", None))
    return None if same else "builds a different backend (this one was changed after it was made)"


# --------------------------------------------------------------------------- importing

def _load_entry_point(ep: importlib.metadata.EntryPoint, field: str) -> object:
    try:
        return ep.load()
    except Exception as exc:  # an installed plugin can fail in any way; name it
        raise SpecError(field, ep.name, f"an entry point that loads ({ep.value}: {type(exc).__name__}: {exc})") \
            from exc


def _import_object(target: str, field: str) -> object:
    """The object 'package.module:attr' (attr may be dotted) names: both halves dotted Python names (no
    relative import), and the module none of difftest's own outside difftest.backends (difftest.cli:main
    takes no argument, so it would pass for a factory and run the command again, and again)."""
    module_name, _, attr = target.partition(":")
    if not _DOTTED.fullmatch(module_name) or not _DOTTED.fullmatch(attr):
        raise SpecError(field, target, f"{_TARGET}: dotted Python names on both sides of the ':'")
    if module_name.partition(".")[0] in _OWN_PACKAGES and not (module_name + ".").startswith("difftest.backends."):
        raise SpecError(field, target, f"a backend: {module_name} is difftest's own machinery (its backends "
                        "are in difftest.backends and have registered names)")
    obj: object = _import_module(module_name, field, target)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(field, target, f"an object named {attr!r} in module {module_name!r}")
        obj = getattr(obj, part)
    return obj


def _import_module(module_name: str, field: str, target: str) -> ModuleType:
    """Import with the working directory on sys.path for this import only; an ImportError says
    which path was searched."""
    cwd = os.getcwd()
    present = any(os.path.realpath(p or os.curdir) == os.path.realpath(cwd) for p in sys.path)
    searched = list(sys.path) if present else [*sys.path, cwd]
    if not present:
        sys.path.append(cwd)  # after site-packages: a stray file in the folder cannot shadow a library
    try:
        importlib.invalidate_caches()  # a module written since the last import attempt is found
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(field, target, f"an importable module ({exc}; sys.path searched: {searched})") from exc
    finally:
        if not present and cwd in sys.path:
            sys.path.remove(cwd)


def _takes_no_arguments(obj: object) -> bool:
    """Whether `obj()` is a valid call: a factory, not a kernel function missing its decorator."""
    try:
        inspect.signature(obj).bind()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


copyreg.pickle(Loaded, _reduced)
