"""vLLM's paged torch reference, fp8_paged_mqa_logits_torch, loaded from a release's file without importing vllm.

The function lives in vllm/v1/attention/ops/rocm_aiter_mla_sparse.py, the file vllm_triton_decode also
carries, and is found the same way: the first sys.path entry holding that file, unless vllm itself
(vllm/__init__.py beside it) comes first, in which case vllm_indexer imports vllm as usual. The function
is executed verbatim from the file (difftest.core.triton_interpret.load_kernel_defs) with what it reads
of the rest of vLLM given what it does for this call:
* FP8_DTYPE           the file's `current_platform.fp8_dtype()`: e4m3fnuz on gfx94x, e4m3fn elsewhere.
* F                   torch.nn.functional, as the file imports it.
* vllm.utils.math_utils.cdiv
                      imported inside the function; answered by the module's own `__import__` with
                      vLLM's definition, -(a // -b), and nothing else of vllm.

The releases are data (RELEASES): which functions of the file each one needs, and how the production
caller that hands it a block-split cache calls it. In both releases that caller is
rocm_fp8_paged_mqa_logits' C4A branch (block-flat cache, block size > 1 and not a multiple of 64),
which passes the six arguments positionally; 0.34.0's other caller, the AITER-missing fallback, adds
shuffled=block_size > 1 because the cache it reads was written in 16x16 SHUFFLE tiles, a layout
difftest does not generate, so that call is not made here. A release the table does not know is
reported unavailable rather than called in a way its caller might not.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from difftest.backends import vllm_triton_decode
from difftest.backends.vllm_triton_decode import KernelTree
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.triton_interpret import global_names, load_kernel_defs

FUNCTION = "fp8_paged_mqa_logits_torch"
MATH_UTILS = "vllm.utils.math_utils"


@dataclasses.dataclass(frozen=True)
class Release:
    """One vLLM release's fp8_paged_mqa_logits_torch: what to execute from its file, and how it is called."""

    defs: tuple[str, ...]  # top-level functions of the file the reference needs
    caller: str  # the production call made here (file:line in that release)

    def call(self, function: Callable[..., torch.Tensor], inputs: KernelInputs) -> torch.Tensor:
        """The caller's call: q, cache, weights, the (B, next_n) lengths, block table and max_model_len."""
        return function(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens, inputs.block_table,
                        inputs.max_model_len)


RELEASES: dict[str, Release] = {
    # Its next_n > 1 branch slices kv_cache[..., :D] and [..., D:]: token-interleaved bytes
    # (docs/findings/vllm-torch-ref-layout.md); its next_n = 1 branch reads block-split ones.
    "0.33.0": Release(
        defs=(FUNCTION,),
        caller="rocm_aiter_mla_sparse.py:805 (C4A block-flat, block size not a multiple of 64)"),
    # Both branches read block-split bytes: "A block holds its block_size * dim values, then its
    # block_size scales (not per-token [values | scale] rows)" (:543-544). It calls
    # _unshuffle_indexer_k_values only when shuffled; loaded so that every name it reads is defined.
    "0.34.0": Release(
        defs=(FUNCTION, "_unshuffle_indexer_k_values"),
        caller="rocm_aiter_mla_sparse.py:865 (C4A block-flat, block size not a multiple of 64; shuffled left False)"),
}


def release_of(tree: KernelTree) -> tuple[Release | None, str | None]:
    """(the tree's entry in RELEASES, None), or (None, why not): no version file, or a release not in the table."""
    version = tree.version()
    if version in RELEASES:
        return RELEASES[version], None
    return None, (f"{tree.file} is vllm {version or '(version unknown)'}; {FUNCTION} is called as the releases "
                  f"{', '.join(RELEASES)} call it (difftest.backends.vllm_torch_ref.RELEASES)")


def describe(tree: KernelTree) -> str:
    """The contract's `library`: version, function and the file it came from."""
    release, _ = release_of(tree)
    called = f"; called as {release.caller}" if release is not None else ""
    return f"vllm {tree.version() or '(version unknown)'} ({FUNCTION} from {tree.file}, vllm not imported{called})"


def cdiv(a: int, b: int) -> int:
    """vllm.utils.math_utils.cdiv: ceiling division."""
    return -(a // -b)


def _import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """The loaded functions' `import`: vLLM's math_utils (for cdiv) is _MATH_UTILS; all else as usual."""
    if name == MATH_UTILS:
        return _MATH_UTILS
    return builtins.__import__(name, globals_, locals_, fromlist, level)


_MATH_UTILS = ModuleType(MATH_UTILS, "vllm.utils.math_utils as far as fp8_paged_mqa_logits_torch uses it")
_MATH_UTILS.cdiv = cdiv  # type: ignore[attr-defined]


def fp8_dtype() -> torch.dtype:
    """The file's FP8_DTYPE, current_platform.fp8_dtype(): e4m3fnuz on gfx94x (vllm/platforms/rocm.py)."""
    return torch.float8_e4m3fnuz if vllm_triton_decode.on_gfx94x() else torch.float8_e4m3fn


def _namespace() -> dict[str, object]:
    return {"torch": torch, "F": torch.nn.functional, "FP8_DTYPE": fp8_dtype(),
            "__builtins__": {**vars(builtins), "__import__": _import}}


def load(tree: KernelTree, release: Release) -> ModuleType:
    """The release's functions from the tree's file, as a module named after the file's path (two releases
    loaded in one process stay two modules)."""
    name = f"difftest_vllm_torch_ref_{zlib.crc32(str(tree.file).encode()):08x}"
    return load_kernel_defs(tree.file, release.defs, name, False, _namespace())


def reason(tree: KernelTree) -> str | None:
    """Why the carried reference cannot run: an unknown release, a file without its functions, or a function
    reading a name only vllm provides; None when it can."""
    release, why = release_of(tree)
    if release is None:
        return why
    try:
        module = load(tree, release)
    except Exception as exc:  # a file without the function, a syntax this Python lacks
        return f"loading {', '.join(release.defs)} from {tree.file} failed: {type(exc).__name__}: {exc}"
    known = set(vars(module)) | set(vars(builtins))
    unknown = set().union(*(global_names(getattr(module, name)) for name in release.defs)) - known
    if unknown:
        return f"{FUNCTION} in {tree.file} reads {sorted(unknown)}, which only vllm itself provides"
    return None


def call(tree: KernelTree, inputs: KernelInputs) -> torch.Tensor:
    """The reference's logits [B * next_n, max_model_len], called as the release's caller calls it."""
    release, why = release_of(tree)
    if release is None:
        raise RuntimeError(why)
    return release.call(getattr(load(tree, release), FUNCTION), inputs)


def prepare(tree: KernelTree, inputs: KernelInputs) -> Callable[[], torch.Tensor]:
    """The per-layer call: the torch loop builds nothing once per batch."""
    return functools.partial(call, tree, inputs)
