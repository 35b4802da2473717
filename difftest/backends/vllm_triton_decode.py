"""vLLM's Triton decode indexer kernel loaded from its file, without importing vllm.

vllm does not install where the GPU is (nor in CI), and the file holding the kernel,
vllm/v1/attention/ops/rocm_aiter_mla_sparse.py, imports half of vLLM (config, forward context,
platforms, custom-op registration). What the decode path runs from it is three top-level functions
(DEFS): the @triton.jit kernel, its wrapper rocm_fp8_paged_mqa_logits_triton, which vLLM's
rocm_fp8_paged_mqa_logits calls, and _decode_cu_count. They are executed verbatim from the file
(difftest.core.triton_interpret.load_kernel_defs; on the CPU under the Triton interpreter), and the wrapper
is called with the arguments vLLM's caller passes. The wrapper reads three names the rest of vLLM
provides; each is replaced by what it does for this call (NAMESPACE):
* triton, tl          vllm.triton_utils re-exports the real triton (its placeholder is only for
                      machines without triton, where this module is unavailable anyway).
* current_platform    only .fp8_dtype(): e4m3fnuz on gfx94x (vllm/platforms/rocm.py), e4m3fn elsewhere.
* current_workspace_manager
                      only .get_simultaneous(((rows, max_model_len), float32)): vLLM returns a
                      contiguous float32 view of its reused workspace; here it returns the engine's
                      poisoned buffer of that shape, so positions the kernel never stores stay poison.
A wrapper that reads any other global name is reported unavailable instead of being run.

Which copy is loaded: the first sys.path entry holding FILE (PYTHONPATH for subprocesses and
isolated workers), as every library version is chosen in difftest (docs/versions.md). An entry whose
vllm/ has an __init__.py is vLLM itself, and vllm_indexer imports it as usual; any other entry is a
carried copy (scripts/prepare_versions.sh writes one per release: vllm/_version.py beside the file).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from difftest.backends import carried
from difftest.core import hardware
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.triton_interpret import global_names, interpreter_compat, load_kernel_defs

FILE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
VERSION_FILE = "vllm/_version.py"
KERNEL = "_fp8_paged_mqa_logits_decode_kernel"
WRAPPER = "rocm_fp8_paged_mqa_logits_triton"
DEFS = (KERNEL, WRAPPER, "_decode_cu_count")


@dataclasses.dataclass(frozen=True)
class KernelTree:
    """A sys.path entry holding FILE: vLLM itself, or a carried copy of the file."""

    root: Path

    @property
    def file(self) -> Path:
        return self.root / FILE

    @property
    def whole_vllm(self) -> bool:
        """vllm/__init__.py beside the file: an installed vllm, to be imported as usual."""
        return (self.root / "vllm" / "__init__.py").is_file()

    def version(self) -> str | None:
        """__version__ of vllm/_version.py, read as text; None when the tree has none."""
        return carried.CarriedFile(self.root, FILE).version((VERSION_FILE,))

    def describe(self) -> str:
        """The library as contracts and reports name it: version, function and the file it came from."""
        return f"vllm {self.version() or '(version unknown)'} ({WRAPPER} from {self.file}, vllm not imported)"


def find_tree(entries: Iterable[str] | None = None) -> KernelTree | None:
    """The first of `entries` (sys.path by default) holding FILE; '' is the working directory."""
    found = carried.find((FILE,), entries)
    return None if found is None else KernelTree(found.root)


def carried_tree() -> KernelTree | None:
    """The copy to load without importing vllm, or None: no copy found, or vLLM itself comes first."""
    tree = find_tree()
    return tree if tree is not None and not tree.whole_vllm else None


# --------------------------------------------------------------------------- what the wrapper reads of vLLM

class _Platform:
    """vLLM's current_platform, as far as the wrapper uses it."""

    @staticmethod
    def fp8_dtype() -> torch.dtype:
        return torch.float8_e4m3fnuz if on_gfx94x() else torch.float8_e4m3fn


def on_gfx94x() -> bool:
    """An MI300-class GPU, whose fp8 is e4m3fnuz."""
    return hardware.is_rocm() and hardware.cuda_unavailable_reason() is None and hardware.arch().startswith("gfx94")


class _Workspace:
    """vLLM's workspace manager, as far as the wrapper uses it: one float32 buffer per call."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def get_simultaneous(self, *requests: tuple[tuple[int, ...], torch.dtype]) -> list[torch.Tensor]:
        held = [] if self.buffer is None else [(tuple(self.buffer.shape), self.buffer.dtype)]
        if [(tuple(shape), dtype) for shape, dtype in requests] != held:
            raise RuntimeError(f"the wrapper asked the workspace for {list(requests)}; difftest holds {held}")
        assert self.buffer is not None
        return [self.buffer]


_WORKSPACE = _Workspace()


@contextlib.contextmanager
def _workspace_holding(buffer: torch.Tensor) -> Iterator[None]:
    _WORKSPACE.buffer = buffer
    try:
        yield
    finally:
        _WORKSPACE.buffer = None


def _namespace() -> dict[str, object]:
    import triton  # deferred: the module is listed (and its reasons given) without triton
    import triton.language as tl

    return {"functools": functools, "torch": torch, "triton": triton, "tl": tl,
            "current_platform": _Platform, "current_workspace_manager": lambda: _WORKSPACE}


# --------------------------------------------------------------------------- loading, reasons, calls

def load(tree: KernelTree, interpret: bool) -> ModuleType:
    """DEFS of the tree's file as a module (interpreted for the CPU, compiled for a GPU); named after
    the file's path, so two versions loaded in one process stay two modules."""
    name = f"difftest_vllm_triton_decode_{zlib.crc32(str(tree.file).encode()):08x}"
    return load_kernel_defs(tree.file, DEFS, name, interpret, _namespace())


def unknown_names(module: ModuleType) -> set[str]:
    """Global names the loaded functions read that neither the file's DEFS nor the namespace define."""
    known = set(vars(module)) | set(vars(builtins))
    return set().union(*(global_names(getattr(module, name)) for name in DEFS)) - known


def reason(tree: KernelTree, device: str) -> str | None:
    """Why the carried kernel cannot run on `device`, most basic cause first; None when it can."""
    if device not in ("cpu", "cuda"):
        return f"device {device!r} is neither 'cpu' (Triton interpreter) nor 'cuda'"
    why = _cuda_reason() if device == "cuda" else None
    if why:
        return why
    try:
        module = load(tree, interpret=device == "cpu")
    except Exception as exc:  # no triton, a file without the kernel, a syntax this Python lacks
        return f"loading {', '.join(DEFS)} from {tree.file} failed: {type(exc).__name__}: {exc}"
    unknown = unknown_names(module)
    if unknown:
        return f"{WRAPPER} in {tree.file} reads {sorted(unknown)}, which only vllm itself provides"
    return None


def _cuda_reason() -> str | None:
    why = hardware.cuda_unavailable_reason()
    if why:
        return why
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set in the environment, so Triton compiles nothing for the GPU"
    arch = hardware.arch()
    if not hardware.is_rocm() and int(arch.removeprefix("sm")) < 89:
        return f"an fp8 tl.dot needs sm89 or newer, this GPU is {arch}"
    return None


def call(tree: KernelTree, inputs: KernelInputs, out: torch.Tensor) -> torch.Tensor:
    """The wrapper, as vLLM's rocm_fp8_paged_mqa_logits calls it; it writes `out` (the workspace)."""
    interpret = inputs.q.device.type == "cpu"
    wrapper = getattr(load(tree, interpret), WRAPPER)
    with _workspace_holding(out), interpreter_compat() if interpret else contextlib.nullcontext():
        return wrapper(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens, inputs.block_table,
                       inputs.max_model_len)


def prepare(tree: KernelTree, inputs: KernelInputs, out: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The per-layer call: the wrapper again on the same inputs (it builds nothing once per batch)."""
    load(tree, inputs.q.device.type == "cpu")
    return functools.partial(call, tree, inputs, out)
