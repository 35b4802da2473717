"""FlagGems 5.0.2's DSA top-k, `bucket_sort_topk` (flag_gems/fused/DSA/bin_topk.py), launched as its wrapper
launches it: Triton, compiled on a GPU, interpreted on the CPU.

`bucket_sort_topk(inputs, starts, ends, topk)` (:1106-1113) runs the stock-Triton kernel unless FlagTree's
`triton.experimental.tle` exists; `bucket_sort_topk_triton` (:251-272) allocates int32 `indices` [B, topk]
filled with -1 and an int32 candidate list `s_input_idx` [B, 4096] (SMEM_INPUT_SIZE), and launches
`kernel_bucket_sort_topk[(B,)]` (:59-248, autotuned over BS/BSS, key ["S", "K"]). Its caller in FlagOS's
vLLM plugin passes zero starts and the causal ends (`bucket_sort_topk(logits, starts, kv_ends, topk=2048)`)
and its sparse-MLA consumer drops any index past the causal limit (`kv_ids <= max_col`,
flag_gems/fused/DSA/sparse_mla.py:101-102).

Conventions, read from the kernel and confirmed under the interpreter (TopkContract below):
* indices are columns of the row (ABSOLUTE), not counted from the window's start;
* no -1 for short windows: masked loads count as -inf in the first histogram, so their columns enter the
  candidate list and later rounds re-read their real values: the slots the window cannot fill hold
  columns outside it (OUTSIDE_COLUMNS), which the consumer above masks;
* the row base is `inputs + i_b * S` with S the width (no stride argument): rows must be contiguous;
* NaN ranks highest (convert_to_uint32 maps 0x7FC00000 above +inf);
* S and K are tl.constexpr: one compile per (width, k).

The candidate list of the threshold bin is written without a bound (:141-146, 221-229): a bin holding more
than 4096 candidates writes into the next row's list, and the last row's past the buffer
(docs/findings/flaggems-bucket-topk-candidate-overflow.md). The first pass covers ceil(width / BS) * BS lanes
and every lane outside the window, those past the width included, loads as -inf (bin 0): a row whose window
holds at most k values lists every other lane, up to the last of its last block. So a row lists at most
ceil(width / BS) * BS candidates, and BS reaches 8192 (LARGEST_BS): on the GPU the autotuner runs all ten
configs on the first call of each (width, k), on the wrapper's own buffers. This adapter allocates
the buffer exactly as the wrapper does, followed by a guard of ceil(width / 8192) * 8192 int32 slots, counts
what lands there (OutOfBoundsWrite) and keeps this process's memory safe; the kernel's addressing is the
wrapper's.

No count is clamped either: a round counts its picks on a first read of the list (the histogram pass,
:174-198) and stores what a second read finds above the threshold (:201-232), then the final fill stores the
count's remainder (:236-248); when the list changed in between (another row's ids landed on it), the row
stores more than k indices and the excess goes into the next row's output slots, the last row's past the
output. The output is followed by a guard too (4 * (lanes + 1024) + k slots: at most the lanes four rounds
read, then the final fill), counted in last_indices_out_of_bounds.

`FlagGemsBucketTopk(overflow_lands_late=True)` runs, on the CPU only, the GPU schedule in which a row's
candidates written into the next row's list land after that row has written its own
(difftest.core.triton_interpret.late_cross_program_stores): before it reads them (Landing.FIRST_READ), or
between its first round's two reads of them (Landing.REREAD); indices stored into the next row's slots land
after that row's own (Landing.END). What the interpreter's one-row-after-another order never shows.

Which flag_gems: the first on sys.path (`pip install --no-deps flag-gems==5.0.2`, or the tree
scripts/prepare_topk_deps.sh extracts). The file is loaded by path, its only flag_gems import (has_triton_tle)
answered by a stub: flag_gems/__init__.py (which registers aten overrides) never runs. On the CPU one
autotune config is launched directly (the interpreter has no driver to benchmark configs with).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from difftest.backends.topk_base import TopkBackend
from difftest.core import hardware
from difftest.core.kinds import IndexConvention, NanRanking, RowStride, TopkPadding, WindowForm
from difftest.core.topk import TopkContract, TopkInputs
from difftest.core.triton_interpret import Landing, interpreter_compat, late_cross_program_stores, load_kernel_defs

DISTRIBUTION = "flag-gems"
KERNEL_FILE = "fused/DSA/bin_topk.py"
KERNEL = "kernel_bucket_sort_topk"
DEFINITIONS = ("convert_to_uint16", "convert_to_uint32", KERNEL)
HISTOGRAM_SIZE = 256  # bucket_sort_topk_triton's constants (bin_topk.py:254-255)
SMEM_INPUT_SIZE = 4096
# One of the autotuner's ten configs (bin_topk.py:44-55), launched directly on the CPU; large blocks interpret
# fast. BS/BSS (block sizes of its loops) change only what the kernel gets wrong: how many lanes past the width
# a row lists, how many -1 slots its padding lanes leave.
CPU_CONFIG = {"BS": 1024, "BSS": 256}
GUARD_FILL = -7  # what the guard past the candidate list holds until a write lands there
LARGEST_BS = 8192  # the largest BS of the autotuner's configs (bin_topk.py:53-54)
LARGEST_BSS = 1024  # and the largest BSS (bin_topk.py:54)
LOGITS_GUARD = LARGEST_BS  # floats after the logits: the lanes a last block reads past the width


class OutOfBoundsWrite(UserWarning):
    """The kernel wrote candidate ids past the end of the candidate list its wrapper allocates, or indices past
    the end of its output."""


def kernel_file() -> Path | None:
    """bin_topk.py of the flag_gems found on sys.path (without importing flag_gems), or None."""
    spec = importlib.util.find_spec("flag_gems")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / KERNEL_FILE
    return path if path.is_file() else None


def flaggems_version() -> str | None:
    """The version of the flag_gems tree found: its installed metadata, else the VERSION file beside it."""
    path = kernel_file()
    if path is None:
        return None
    version_file = path.parents[3] / "VERSION"
    if version_file.is_file():
        return version_file.read_text().strip()
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_kernels(interpret: bool) -> ModuleType:
    """The kernel and the two device functions it calls, executed from the file (decorators included)."""
    import triton  # deferred: only a launch needs Triton, not listing the backends
    import triton.language as tl  # deferred: as above

    path = kernel_file()
    if path is None:
        raise FileNotFoundError(f"no {KERNEL_FILE} under a flag_gems package on sys.path")
    return load_kernel_defs(path, DEFINITIONS, "difftest_flaggems_bin_topk", interpret,
                            {"triton": triton, "tl": tl, "torch": torch})


@contextlib.contextmanager
def interpreter_extras() -> Iterator[None]:
    """What this kernel needs of the interpreter beyond difftest.core.triton_interpret.interpreter_compat:
    * tensor methods that are Triton standard-library functions (`x.cumsum(0, reverse=True)`, bin_topk.py:102)
      are JITFunctions bound to the tensor class, which the interpreter refuses to call: they are swapped for
      InterpretedFunctions of the same Python code, as interpreter_compat swaps the module-level ones;
    * the all-ones value of `~x` on an unsigned tensor (bin_topk.py:37) is built as np.full(1, -1, uint32),
      which numpy >= 2 refuses (NEP 50): built as the type's maximum instead, the same bits."""
    import numpy as np  # deferred: with the interpreter only
    import triton.language as tl  # deferred: as above
    from triton.runtime import interpreter  # deferred: as above
    from triton.runtime.jit import JITFunction  # deferred: as above

    original = interpreter.InterpreterBuilder.get_all_ones_value
    members = {name: fn for name, fn in vars(tl.core.tensor).items() if isinstance(fn, JITFunction)}

    def all_ones(self: object, type_: object) -> object:
        np_type = interpreter._get_np_dtype(type_)
        if np.issubdtype(np_type, np.unsignedinteger):
            return interpreter.TensorHandle(np.full(1, np.iinfo(np_type).max, dtype=np_type), type_.scalar)
        return original(self, type_)

    interpreter.InterpreterBuilder.get_all_ones_value = all_ones
    for name, fn in members.items():
        setattr(tl.core.tensor, name, _method(interpreter.InterpretedFunction(fn.fn)))
    try:
        yield
    finally:
        interpreter.InterpreterBuilder.get_all_ones_value = original
        for name, fn in members.items():
            setattr(tl.core.tensor, name, fn)


def _method(function: Callable[..., object]) -> Callable[..., object]:
    """`function` as a method: a plain function binds `self` when read from an instance, a callable object not."""
    return lambda self, *args, **kwargs: function(self, *args, **kwargs)


def _has_tle() -> bool:
    """Whether FlagTree's TLE extension of Triton is importable (stock Triton has none)."""
    try:
        return importlib.util.find_spec("triton.experimental.tle") is not None
    except ImportError:  # no triton.experimental at all
        return False


def _guarded(logits: torch.Tensor) -> torch.Tensor:
    """A copy of the (contiguous) logits followed by LOGITS_GUARD -inf floats. A window shorter than k makes
    the kernel read the columns its last block covers past the row's width (bin_topk.py:186-189, up to BS - 1
    floats): for the last row that is past the caller's buffer, here the guard. Rows are laid out as given."""
    rows, width = logits.shape
    storage = torch.full((rows * width + LOGITS_GUARD,), -math.inf, dtype=logits.dtype, device=logits.device)
    storage[:rows * width] = logits.reshape(-1)
    return storage[:rows * width].view(rows, width)


def _lanes(width: int) -> int:
    """The most lanes a row's first pass covers under any autotune config: ceil(width / 8192) * 8192."""
    return -(-width // LARGEST_BS) * LARGEST_BS


def _index_guard(width: int, k: int) -> int:
    """Slots after the output: the most a last row can store past its k. A round stores what its second read of
    the list finds above the threshold its first read set, at most the lanes it reads (a list of at most
    _lanes(width) ids and the padding lanes of its last block), four rounds, then the final fill's k."""
    return 4 * (_lanes(width) + LARGEST_BSS) + k


def _library() -> str:
    version = flaggems_version()
    path = kernel_file()
    name = f"{DISTRIBUTION} {version}" if version else f"{DISTRIBUTION} (not found)"
    return f"{name} ({path})" if path else name


class FlagGemsBucketTopk:
    """`bucket_sort_topk` (stock-Triton path), its wrapper's allocation reproduced with a guard."""

    name = "flaggems-bucket-topk"

    def __init__(self, overflow_lands_late: bool = False, landing: Landing = Landing.FIRST_READ) -> None:
        self.contract = TopkContract(
            index=IndexConvention.ABSOLUTE, padding=TopkPadding.OUTSIDE_COLUMNS, window=WindowForm.STARTS_ENDS,
            nan=NanRanking.HIGHEST, row_stride=RowStride.EQUALS_WIDTH, library=_library())
        self.overflow_lands_late = overflow_lands_late  # the GPU schedule emulated on the CPU (module docstring)
        self.landing = landing  # when, in the receiving row's run, the late ids land (module docstring)
        if overflow_lands_late:
            self.name = f"{self.name}-overflow-lands-late-{landing.value}"
        self.last_out_of_bounds = 0  # candidate ids the last call wrote past its list
        self.last_indices_out_of_bounds = 0  # indices the last call wrote past its [rows, k] output

    def unavailable_reason(self, device: str) -> str | None:
        """Why the kernel cannot run on `device`, most basic cause first; None when it can."""
        if device not in ("cpu", "cuda"):
            return f"device {device!r} is neither 'cpu' (Triton interpreter) nor 'cuda'"
        if kernel_file() is None:
            return (f"{DISTRIBUTION} is not on sys.path (importlib.util.find_spec('flag_gems') finds no "
                    f"{KERNEL_FILE}): pip install --no-deps flag-gems==5.0.2")
        if _has_tle():
            return "FlagTree's triton.experimental.tle is present: bucket_sort_topk would run its TLE kernel instead"
        if device == "cuda":
            if self.overflow_lands_late:
                return "the late-overflow schedule is emulated under the interpreter (CPU); a GPU picks its own"
            reason = hardware.cuda_unavailable_reason()
            if reason or os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
                return reason
            return "TRITON_INTERPRET is set in the environment, so Triton compiles nothing for the GPU"
        try:
            load_kernels(interpret=True)
        except Exception as exc:  # a newer kernel file may define other names
            return f"loading {kernel_file()} failed: {type(exc).__name__}: {exc}"
        return None

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k] absolute columns, as bucket_sort_topk_triton returns them."""
        logits, k = inputs.logits, inputs.k
        rows, width = logits.shape
        output = torch.full((rows * k + _index_guard(width, k),), GUARD_FILL, dtype=torch.int32, device=logits.device)
        output[:rows * k] = -1
        indices = output[:rows * k].view(rows, k)
        storage = torch.zeros(rows * SMEM_INPUT_SIZE + _lanes(width), dtype=torch.int32, device=logits.device)
        storage[rows * SMEM_INPUT_SIZE:] = GUARD_FILL
        candidates = storage[:rows * SMEM_INPUT_SIZE].view(rows, SMEM_INPUT_SIZE)
        autotuned = False
        if rows:
            autotuned = self._launch(_guarded(logits), indices, candidates, inputs.row_starts, inputs.row_ends,
                                     width, k)
        trials = " (this call also ran the autotuner's configs on these buffers)" if autotuned else ""
        self.last_out_of_bounds = _written_past(storage[rows * SMEM_INPUT_SIZE:], lambda n: (
            f"{self.name} wrote {n} candidate ids past the end of its [rows, {SMEM_INPUT_SIZE}] candidate list "
            f"(width {width}, k {k}){trials}: a threshold bin held more than {SMEM_INPUT_SIZE} candidates (a row's "
            "lanes outside its window, up to a block past the width, count as -inf)"))
        self.last_indices_out_of_bounds = _written_past(output[rows * k:], lambda n: (
            f"{self.name} wrote {n} indices past the end of its [rows, {k}] output (width {width}){trials}: the "
            "last row's rounds stored more picks than they had counted (its candidate list changed between a "
            "round's two reads)"))
        return indices.clone()  # its own storage: the guard after it is the adapter's, not the result's

    def _launch(self, logits: torch.Tensor, indices: torch.Tensor, candidates: torch.Tensor, starts: torch.Tensor,
                ends: torch.Tensor, width: int, k: int) -> bool:
        """Launch as the wrapper does; whether the autotuner ran its configs on these buffers first."""
        interpret = logits.device.type == "cpu"
        kernel = getattr(load_kernels(interpret), KERNEL)
        args = (logits, indices, candidates, starts, ends, width, k, HISTOGRAM_SIZE, SMEM_INPUT_SIZE)
        if not interpret:
            tuned = len(kernel.cache)
            kernel[(logits.shape[0],)](*args)  # the autotuner picks BS/BSS, as in the wrapper
            return len(kernel.cache) > tuned
        rows = logits.shape[0]
        with interpreter_compat(), interpreter_extras(), contextlib.ExitStack() as schedule:
            if self.overflow_lands_late:
                schedule.enter_context(late_cross_program_stores(
                    candidates.data_ptr(), SMEM_INPUT_SIZE * candidates.element_size(), rows, self.landing))
                # a row's indices past its k slots (a round counted fewer picks than it then stored) land after
                # the next row's own: that row writes its first picks in its first pass, long before
                schedule.enter_context(late_cross_program_stores(indices.data_ptr(), k * indices.element_size(), rows,
                                                                 Landing.END))
            kernel.fn[(rows,)](*args, **CPU_CONFIG)
        return False


def _written_past(guard: torch.Tensor, message: Callable[[int], str]) -> int:
    """How many of the guard's slots the kernel wrote (each was GUARD_FILL before the call); a warning saying so."""
    written = int((guard != GUARD_FILL).sum())
    if written:
        warnings.warn(message(written), OutOfBoundsWrite, stacklevel=2)
    return written


TOPK_BACKENDS: dict[str, Callable[[], TopkBackend]] = {"flaggems-bucket-topk": FlagGemsBucketTopk}
