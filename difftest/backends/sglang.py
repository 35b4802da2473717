"""sglang 0.5.23's own paged MQA logits: its torch reference indexer and its TileLang kernel, each loaded
from its file without importing sglang, and called as sglang's indexers call them.

* sglang-torch-ref  sglang/srt/layers/attention/dsv4/indexer.py:82-145 `fp8_paged_mqa_logits_torch`
                    (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH; called at dsv4/indexer.py:1089-1098). Plain torch:
                    CPU and GPU.
* sglang-tilelang   sglang/kernels/ops/attention/dsa/tilelang_kernel.py:1259-1394
                    `tilelang_fp8_paged_mqa_logits` (called at srt/layers/attention/dsa/dsa_indexer_kpool.py:
                    1063-1075 when `_should_use_tilelang_paged_mqa_logits` (:970-976): arch_major == 9 and
                    the head count is not DeepGEMM's 32 or 64). TileLang JIT-compiles it for the GPU: cuda only.

Both take the same arguments, `(q_fp8 [B, 1, H, 128], kvcache_fp8 [pages, 64, 1, 132], weight [B, H],
seq_lens (B,), page_table [B, W], deep_gemm_metadata, max_seq_len, clean_logits)`, and assert (torch
reference :97-104, TileLang :1362-1371): head dim 128, page 64, next_n 1 (one query row per "batch"
row, one length and one table row each: the flattened encoding), and clean_logits False.
`deep_gemm_metadata` is never read. The cache is block-split: per 64-token page, the fp8 keys, then
64 fp32 scales (sglang's index-key pool, srt/mem_cache/memory_pool.py, viewed [pages, 64, 1, 132]).
Both callers pass `max_seq_len = page_table.shape[1] * 64` (dsa_indexer_kpool.py:1041,
dsv4/metadata.py:323-324: max_compressed_seq_len) and leave the tail to the top-k, which reads each
row's first `seq_lens` columns: neither kernel cleans it (tail-unspecified).

The functions are executed verbatim from their files (difftest.core.triton_interpret.load_kernel_defs);
the names they read from the rest of their modules are given here (NAMESPACE comments cite where the
file sets each). Which copy: the first sys.path entry holding the file (difftest.backends.carried).
sglang's other paged-logits files hold nothing new to test: kernels/ops/attention/dsa/paged_mqa_logits.py
wraps DeepGEMM (sgl-deep-gemm), AITER and a CuTe-DSL (sm100) runner, and dsa/triton_kernel.py compacts
page tables; dsv4/fp4_indexer.py reads MXFP4 keys, which a case's fp8 keys do not convert to without
changing the problem (docs/versions.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from difftest.backends import carried
from difftest.backends.base import Backend
from difftest.backends.vllm_triton_decode import on_gfx94x
from difftest.core import hardware
from difftest.core.contract import Contract, WorkingMemory
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention
from difftest.core.triton_interpret import load_kernel_defs

VERSION_FILES = ("sglang/_version.py",)
RELEASE = "sglang 0.5.23"
PAGE = 64  # both assert block_size == 64 (:98, :1363); so do sglang's index-key pools (memory_pool.py:5371)
HEAD_DIM = 128  # both assert head_dim == 128 (:97, :1362)

# The reference's per-head dots are a bf16 bmm (:117, :124-125): products of fp8 values are exact and
# summed in fp32, then each dot d_h is rounded to bf16, |error| <= 2^-8 |d_h|. ReLU, weights, the head sum
# and the scale are fp32 (:126-129), so a logit errs by at most 2^-8 * s * sum_h |w_h| |d_h|: relative to the
# row's largest |logit|, 2^-8 * R with R = max_p s_p sum_h |w_h| |d_h| / max_p |logit_p|, how much the heads'
# signed weights cancel. R is not bounded (it reached 136 in difftest's integer-valued draws), so no rtol
# is rigorous; the roundings do not all go one way, though: over 1080 drawn cases (H 8, 32, 64; normal,
# heavy-tailed and integer values; 2026-12-04, CPU) the largest error was 1.4e-2 of the row's largest logit.
# 2^-8 * 16 = 6.25e-2 leaves a factor of 4 above that; a wrong position or scale is off by far more.
TORCH_REF_RTOL = 2.0 ** -8 * 16
# What the reference allocates per output position (a row's W * 64 table positions, at least its
# max_model_len columns) besides its output, from :113-138: the gathered pages (132 bytes), the keys made
# contiguous (128) and in bf16 (256), the scales (4 + 4), the valid mask (1) and the masked and summed
# fp32 rows (4 + 4 + 4): 537, held to the end; per head, the bmm's bf16 dots and their ReLU (2 + 2) and the
# weighted fp32 copy (4).
TORCH_REF_MEMORY = WorkingMemory(bytes_per_logit=540, bytes_per_logit_per_head=8)
# wgmma of fp8 operands with fp32 accumulation (T.gemm, :1330-1337): DeepGEMM's margin, not yet measured.
TILELANG_RTOL = 1e-2
# The head counts sglang routes to TileLang on sm90 (any but 32 and 64) that lower for sm_90a with
# tilelang 0.1.12 and 0.1.15 (4 fails: wgmma's N must be a multiple of 8); others untried.
TILELANG_HEADS = (8, 16, 128)


@dataclasses.dataclass(frozen=True)
class SglangPath:
    """One of sglang's two paged-logits functions: where it lives and what it promises."""

    file: str
    defs: tuple[str, ...]  # the top-level functions executed from the file; the last is the one called
    contract: Callable[[str], Contract]
    needs: str | None  # a library besides torch it imports ("tilelang"), or None

    @property
    def function(self) -> str:
        return self.defs[-1]


def _torch_ref_contract(library: str) -> Contract:
    return Contract(
        length_encoding=LengthEncoding.FLATTENED, cache_layout=CacheLayout.BLOCK_SPLIT,
        # :138: 0.0 past each row's length, not -inf; columns past the table (padding, :141) are 0.0 too.
        mask=MaskConvention.TAIL_UNSPECIFIED, fp8=_fp8(), output_dtype=torch.float32, rtol=TORCH_REF_RTOL,
        devices=("cpu", "cuda"), head_dims=(HEAD_DIM,), block_sizes=(PAGE,),
        # Heads: any (a bmm). No tiles, no partition, no context bound: one vectorized gather of every page.
        working_memory=TORCH_REF_MEMORY, library=library, batchable=True)


def _tilelang_contract(library: str) -> Contract:
    return Contract(
        length_encoding=LengthEncoding.FLATTENED, cache_layout=CacheLayout.BLOCK_SPLIT,
        # :1346 copies whole 64-position pages: past L up to the page end, values of whatever sits in the
        # page's unused slots; past the last page, the output's uninitialized memory (new_empty, :1373).
        mask=MaskConvention.TAIL_UNSPECIFIED, fp8=Fp8Flavour.E4M3FN, output_dtype=torch.float32, rtol=TILELANG_RTOL,
        devices=("cuda",), archs=("sm90",), heads=TILELANG_HEADS, head_dims=(HEAD_DIM,), block_sizes=(PAGE,),
        tiles=(PAGE,),
        # No partition declared: each row's pages are cut into split_kv contiguous ranges (:1300-1305), but
        # split_kv = max(1, min(max_seq_len // 64, 256 // B)) (:1375-1376) changes with every call's batch.
        # No max_context: the lowered CUDA addresses pages and rows with 64-bit offsets.
        library=library, batchable=True)


PATHS: dict[str, SglangPath] = {
    "sglang-torch-ref": SglangPath("sglang/srt/layers/attention/dsv4/indexer.py", ("fp8_paged_mqa_logits_torch",),
                              _torch_ref_contract, needs=None),
    "sglang-tilelang": SglangPath("sglang/kernels/ops/attention/dsa/tilelang_kernel.py",
                             ("fp8_paged_mqa_logits_kernel", "tilelang_fp8_paged_mqa_logits"),
                             _tilelang_contract, needs="tilelang"),
}


def _fp8() -> Fp8Flavour:
    """indexer.py:72 FP8_DTYPE: e4m3fnuz where sglang's is_fp8_fnuz() holds (gfx94x), e4m3fn elsewhere."""
    return Fp8Flavour.E4M3FNUZ if on_gfx94x() else Fp8Flavour.E4M3FN


# --------------------------------------------------------------------------- loading

def _namespace(path: SglangPath) -> dict[str, Any]:
    """The module-level names the functions read, as their files set them for a CUDA (or CPU) process."""
    names: dict[str, Any] = {"torch": torch, "Any": Any, "functools": functools}
    if path.needs is None:  # indexer.py:17, :72, :78
        return {**names, "F": F, "FP8_DTYPE": _fp8().dtype, "_arange_cache": {}}
    tilelang = importlib.import_module("tilelang")
    key = tilelang.PassConfigKey
    # tilelang_kernel.py:36-44: warp specialization and TMA lowering off, fast math off (0.1.12 and 0.1.15
    # name that TL_ENABLE_FAST_MATH).
    configs = {key.TL_DISABLE_WARP_SPECIALIZED: True, key.TL_DISABLE_TMA_LOWER: True}
    if hasattr(key, "TL_DISABLE_FAST_MATH"):
        configs[key.TL_DISABLE_FAST_MATH] = True
    elif hasattr(key, "TL_ENABLE_FAST_MATH"):
        configs[key.TL_ENABLE_FAST_MATH] = False
    # :51-55 on CUDA (is_fp8_fnuz() is False there).
    return {**names, "tilelang": tilelang, "T": importlib.import_module("tilelang.language"),
            "pass_configs": configs, "FP8": "float8_e4m3fn", "FP32": "float32", "INT32": "int32", "UINT8": "uint8"}


def load(path: SglangPath, found: carried.CarriedFile) -> ModuleType:
    """The path's functions from the file found, as a module (one per file)."""
    name = f"difftest_sglang_{zlib.crc32(str(found.path).encode()):08x}"
    return load_kernel_defs(found.path, path.defs, name, False, _namespace(path))


def describe(path: SglangPath, found: carried.CarriedFile | None) -> str:
    """'sglang 0.5.23 (FUNCTION from FILE, sglang not imported)'."""
    if found is None:
        return f"sglang (no copy of {path.file} on sys.path)"
    return f"sglang {found.version(VERSION_FILES) or '(version unknown)'} ({path.function} from {found.path}, " \
           f"sglang not imported)"


# --------------------------------------------------------------------------- the backend

class Sglang:
    """One of sglang's paged-logits functions (PATHS[name]), called as its indexer calls it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = PATHS[name]

    @property
    def contract(self) -> Contract:
        """The path's envelope; `library` names the copy of the file found."""
        return self.path.contract(describe(self.path, self._found()))

    def _found(self) -> carried.CarriedFile | None:
        return carried.find((self.path.file,))

    def unavailable_reason(self, device: str) -> str | None:
        """Why this path cannot run on `device`, most basic cause first; None when it can."""
        if device not in self.contract.devices:
            return f"{self.path.function} runs on {' and '.join(self.contract.devices)} only (device {device})"
        why = hardware.cuda_unavailable_reason() if device == "cuda" else None
        found = self._found()
        if why or found is None:
            return why or carried.missing_reason((self.path.file,), RELEASE)
        if self.path.needs:
            try:
                importlib.import_module(self.path.needs)
            except Exception as exc:  # a native library it links may be missing too
                return (f"{self.path.needs} not importable ({type(exc).__name__}: {exc}); scripts/"
                        f"prepare_field_deps.sh --tilelang packs the release sglang 0.5.23 pins")
        try:
            load(self.path, found)
        except Exception as exc:  # a file without the function, a syntax this Python lacks
            return f"loading {', '.join(self.path.defs)} from {found.path} failed: {type(exc).__name__}: {exc}"
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len] float32; the tail past each row's length is not cleaned."""
        return self.prepare(inputs, out)()

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The call itself: the function builds nothing once per batch (Preparable)."""
        found = self._found()
        if found is None:
            raise RuntimeError(carried.missing_reason((self.path.file,), RELEASE))
        return functools.partial(_call, getattr(load(self.path, found), self.path.function), inputs)


def _call(function: Callable[..., torch.Tensor], inputs: KernelInputs) -> torch.Tensor:
    """The call of dsv4/indexer.py:1089-1098 and dsa_indexer_kpool.py:1068-1077: positional, no schedule
    read, clean_logits False, max_seq_len the table's width in tokens. A case whose table is narrower than
    its max_model_len (never one difftest draws) gets max_model_len, so that every column the oracle
    compares exists; the columns past max_model_len, past every row's length, are not returned."""
    width = max(inputs.block_table.shape[1] * PAGE, inputs.max_model_len)
    logits = function(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens, inputs.block_table, None,
                      width, False)
    return logits[:, :inputs.max_model_len]


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(Sglang, name) for name in PATHS}
