"""vLLM's Step5 Hopper paged MQA logits kernel, `paged_mqa_logits_sm90`, loaded from its file without vllm.

The file is vllm/models/step5/common/ops/sparse_indexer_scores.py in vllm 0.34.0 and
vllm/models/step5/nvidia/ops/sparse_indexer_scores.py in 0.33.0 (the same bytes, sha256 cb2a1865...).
Line numbers below are that file's; "caller" cites vllm 0.34.0's vllm/models/step5/nvidia/
flashinfer_sparse.py. The file imports vLLM (`vllm.triton_utils`, `.sparse_indexer`); what the call
runs is two top-level functions (DEFS), the @triton.jit `_paged_scores_sm90` and its wrapper, which
read only `torch`, `triton` and `tl` (vLLM re-exports the real triton). They are executed verbatim
from the file (on the CPU under the Triton interpreter) and the wrapper is called with the keywords
its caller passes.

    paged_mqa_logits_sm90(q, kv_fused, weights, block_tables, seq_lens, max_seq_len, *, schedule_meta=None)

Not a DeepSeek indexer kernel: Step5 scores region summaries with it, in FlashInfer's argument order,
on GPUs of capability (9, 0) only (caller :46-51; elsewhere it calls flashinfer.attn_scores).
* :292-296  q e4m3fn [B, next_n, H, 256], H in (4, 8, 16); kv_fused uint8 contiguous [pages, page, 1, 260];
            weights [B * next_n, H].
* :297-301  output torch.empty([B * next_n, max_seq_len]) float32, contiguous; grid (rows, cdiv(max_seq_len,
            32)): one program per 32 key positions of a row (TILE, :317), no work partition.
* :316      the page size is kv_fused.shape[1], any value; Step5 packs 32 regions a page.
* :218-221  `length = Lengths[batch * LENGTH_STRIDE]` with `batch = row // NEXT_N`: every draft row of a
            sequence sees the same L (no MTP window; docs/findings/vllm-step5-shared-length.md).
* :269-273  stores `where(valid, result, -inf)` for every position below max_seq_len: the tail is
            cleaned to -inf. `row * REGIONS` is a 32-bit product (the TTGIR has `arith.muli ... : i32`).
* schedule_meta is accepted and never read.

Two callers, two backends (CALLERS):
* vllm-step5         caller `logits()` :360-381 (and `decode_logits` :281-305, which flattens
                     multi-token requests first): q[:, 0].unsqueeze(1), so next_n = 1 and one length
                     and one table row per query row: the flattened encoding.
* vllm-step5-paired  paired prefill :348-359 with `prefill_pair_inputs` :203-217, taken when
                     indexer_heads * 2 == 8 (vllm/models/step5/nvidia/sparse_attention.py:588-594):
                     consecutive rows of a request as next_n = 2 on their 4 heads, `seq_lens =
                     lengths[1::2]` (the second row's, i.e. L_b) and `block_table[::2]`: per sequence.
                     The kernel then gives the first row the second row's length.

Which copy is loaded: the first sys.path entry holding either path (difftest.backends.carried).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import os
import zlib
from collections.abc import Callable
from types import ModuleType

import torch

from difftest.backends import carried
from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention
from difftest.core.triton_interpret import global_names, interpreter_compat, load_kernel_defs

FILES = ("vllm/models/step5/common/ops/sparse_indexer_scores.py",  # 0.34.0
         "vllm/models/step5/nvidia/ops/sparse_indexer_scores.py")  # 0.33.0
VERSION_FILES = ("vllm/_version.py",)
KERNEL = "_paged_scores_sm90"
WRAPPER = "paged_mqa_logits_sm90"
DEFS = (KERNEL, WRAPPER)

HEAD_DIMS = (256,)  # :292 `dim == 256`; the kernel hard-codes 256-byte key rows (:227-233)
HEADS = (4, 8, 16)  # :293; heads are padded to 16 inside the program (:228, masked loads)
TILE = 32  # :301 and :317: key positions per program
PAGE = 32  # Step5's packed summary pages hold 32 regions (caller's warm-up :186-187, (pages, 32, 1, 260))
# tl.dot of fp8 operands with fp32 accumulation (:246, max_num_imprecise_acc=0), then four fp32 FMA
# chains over the heads: DeepGEMM's margin for an fp8 MMA, not yet measured on a GPU. Under the Triton
# interpreter (exact fp32) the largest error was 1.4e-7 of the row's largest logit.
RTOL = 1e-2


@dataclasses.dataclass(frozen=True)
class Caller:
    """How one of the kernel's callers hands it lengths and rows."""

    encoding: LengthEncoding
    next_n: tuple[int, ...] | None  # None: flattened rows, the kernel sees next_n = 1 whatever the case's
    heads: tuple[int, ...]

    def contract(self, library: str) -> Contract:
        """The kernel's envelope as this caller uses it."""
        return Contract(
            length_encoding=self.encoding, cache_layout=CacheLayout.BLOCK_SPLIT,
            mask=MaskConvention.TAIL_NEG_INF, fp8=Fp8Flavour.E4M3FN, output_dtype=torch.float32, rtol=RTOL,
            devices=("cpu", "cuda"), archs=("sm90",), next_n=self.next_n, heads=self.heads, head_dims=HEAD_DIMS,
            block_sizes=(PAGE,), tiles=(TILE,),
            # No max_context: nothing in the kernel bounds it, and the 32-bit row offset (:269) is for the
            # logits-over-2^31 family to reach. No partition: the grid covers every tile of every row.
            library=library, batchable=True)


CALLERS: dict[str, Caller] = {
    "vllm-step5": Caller(LengthEncoding.FLATTENED, next_n=None, heads=HEADS),
    # sparse_attention.py:588-594 pairs rows only when indexer_heads * 2 == 8.
    "vllm-step5-paired": Caller(LengthEncoding.PER_SEQUENCE, next_n=(2,), heads=(4,)),
}


# --------------------------------------------------------------------------- loading

def find() -> carried.CarriedFile | None:
    """The copy of the kernel's file first on sys.path, or None."""
    return carried.find(FILES)


def describe(found: carried.CarriedFile | None) -> str:
    """The library as contracts and reports name it: release, function and the file it came from."""
    if found is None:
        return "vllm (no copy of the Step5 kernel file on sys.path)"
    version = found.version(VERSION_FILES) or "(version unknown)"
    return f"vllm {version} ({WRAPPER} from {found.path}, vllm not imported)"


def load(found: carried.CarriedFile, interpret: bool) -> ModuleType:
    """DEFS of the file as a module (interpreted for the CPU, compiled for a GPU), one per file and mode."""
    import triton  # deferred: the module is listed (and its reasons given) without triton
    import triton.language as tl

    name = f"difftest_vllm_step5_{zlib.crc32(str(found.path).encode()):08x}"
    return load_kernel_defs(found.path, DEFS, name, interpret, {"torch": torch, "triton": triton, "tl": tl})


def reason(found: carried.CarriedFile | None, device: str) -> str | None:
    """Why the kernel cannot run on `device`, most basic cause first; None when it can."""
    if device not in ("cpu", "cuda"):
        return f"device {device!r} is neither 'cpu' (Triton interpreter) nor 'cuda'"
    if found is None:
        return carried.missing_reason(FILES, "vllm 0.33.0 or 0.34.0")
    why = _cuda_reason() if device == "cuda" else None
    if why:
        return why
    try:
        module = load(found, interpret=device == "cpu")
    except Exception as exc:  # no triton, a file without the kernel, a syntax this Python lacks
        return f"loading {', '.join(DEFS)} from {found.path} failed: {type(exc).__name__}: {exc}"
    unknown = set().union(*(global_names(getattr(module, n)) for n in DEFS)) - set(vars(module)) - set(vars(builtins))
    if unknown:
        return f"{WRAPPER} in {found.path} reads {sorted(unknown)}, which only vllm itself provides"
    return None


def _cuda_reason() -> str | None:
    why = hardware.cuda_unavailable_reason()
    if why:
        return why
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set in the environment, so Triton compiles nothing for the GPU"
    if hardware.is_rocm():
        return "the kernel reads e4m3fn keys (tl.float8e4nv); its only CUDA-side caller is Step5's sm90 path"
    return None


# --------------------------------------------------------------------------- the backend

class VllmStep5:
    """paged_mqa_logits_sm90 called as one of its callers (CALLERS[name]) calls it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.caller = CALLERS[name]

    @property
    def contract(self) -> Contract:
        """The caller's envelope; `library` names the copy of the file found."""
        return self.caller.contract(describe(find()))

    def unavailable_reason(self, device: str) -> str | None:
        """No copy of the file on sys.path, no GPU, or a file this adapter cannot run; None when it can."""
        return reason(find(), device)

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len] float32, -inf past each row's (shared) length."""
        return self.prepare(inputs, out)()

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The call itself: the caller builds nothing per batch that the kernel reads (Preparable)."""
        found = find()
        if found is None:
            raise RuntimeError(carried.missing_reason(FILES, "vllm 0.33.0 or 0.34.0"))
        interpret = inputs.q.device.type == "cpu"
        return functools.partial(_call, getattr(load(found, interpret), WRAPPER), inputs, interpret)


def _call(wrapper: Callable[..., torch.Tensor], inputs: KernelInputs, interpret: bool) -> torch.Tensor:
    """The wrapper with the keywords flashinfer_sparse.py passes (:351-359 paired, :373-381 otherwise):
    int32 contiguous lengths, the table as given. The paired caller's schedule_meta (a FlashInfer
    schedule) is never read by the kernel, so None stands for it."""
    with interpreter_compat() if interpret else contextlib.nullcontext():
        return wrapper(q=inputs.q, kv_fused=inputs.kv_cache, weights=inputs.weights,
                       seq_lens=inputs.context_lens.int().contiguous(), block_tables=inputs.block_table,
                       max_seq_len=inputs.max_model_len, schedule_meta=None)


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(VllmStep5, name) for name in CALLERS}
