"""Backends: the Protocol every adapter satisfies, and the registry that finds them.

Adding a built-in backend is an entry in the `BACKENDS` table (name -> zero-argument factory) of a
module listed in registry.BUILTIN_MODULES (another operation's: difftest.backends.stages); a user's own
kernel of any operation comes in through `load_operation_backend(kind, "pkg.mod:obj")` (`load_backend` for
paged logits), a Backend object handed to `as_loaded`, or the entry-point group `difftest.backends`,
without touching difftest. Every load records its `Origin`, from which `rebuild` makes the same backend
in a fresh process.
"""

from difftest.backends.base import Backend, Loaded, Origin
from difftest.backends.registry import (
    BUILTIN_MODULES,
    ENTRY_POINT_GROUP,
    as_backend,
    as_loaded,
    available_names,
    builtin_backends,
    entry_point_backends,
    get_backends,
    load_backend,
    load_of_any_operation,
    load_operation_backend,
    load_operation_registered,
    load_registered,
    operation_names,
    origin_of,
    rebuild,
)

__all__ = ["BUILTIN_MODULES", "ENTRY_POINT_GROUP", "Backend", "Loaded", "Origin", "as_backend", "as_loaded",
           "available_names", "builtin_backends", "entry_point_backends", "get_backends", "load_backend",
           "load_of_any_operation", "load_operation_backend", "load_operation_registered", "load_registered",
           "operation_names", "origin_of", "rebuild"]
