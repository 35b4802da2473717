"""vLLM 0.33's own paged MQA logits paths, called the way its sparse-attention indexer calls them.

Three backends (the PATHS table; one class), all optional: they load only when `vllm` imports (the
`vllm` extra), or, for vllm-torch-ref and vllm-triton-decode, from a copy of their file.

* vllm-torch-ref      vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:
                      fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len)
                      A per-sequence, per-block torch loop: ROCm's fallback when AITER is missing, and for
                      block-flat (C4A) caches whose block size is not a multiple of 64. A peer oracle (CPU, GPU).
                      Without vllm, from a copy of the file first on sys.path (vllm_torch_ref), releases
                      0.33.0 and 0.34.0 (0.34.0 reads the next_n > 1 cache block-split too).
* vllm-triton-decode  same file: rocm_fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens,
                      block_tables, max_model_len): vLLM's Triton decode kernel for block-flat caches (block
                      size a multiple of 64; production reaches it on gfx942/gfx950 for C4A caches), writing
                      into a workspace buffer. GPU only: without a GPU driver vLLM swaps Triton for a placeholder.
                      Without vllm, from a copy of the file first on sys.path (vllm_triton_decode): CPU
                      (Triton interpreter) and GPU, any release 0.31.0-0.34.0 (docs/versions.md).
* vllm-deepgemm       vllm/utils/deep_gemm.py: get_paged_mqa_logits_metadata(context_lens, block_size, num_sms),
                      then fp8_fp4_paged_mqa_logits((q, q_scale), kv_cache, weights, context_lens, block_tables,
                      schedule, max_model_len, indices=None): the CUDA decode path over DeepGEMM. The wrapper
                      halves the schedule slots itself for sm90 next_n = 4 (callers pass the full SM count).

Lengths: vLLM's metadata builder (vllm/v1/attention/backends/mla/indexer.py, _prepare_decode_tensors
and build) hands all three the per-row table: (B, next_n) with len = max(L - next_n + j + 1, 0) on
the native MTP path, and (B, 1) at next_n = 1 (it unsqueezes the 1-D lengths "so downstream kernels
see the same (B, next_n) layout"). Cache: vLLM's indexer writers store each block's keys, then its
fp32 scales (block-split); so do the three readers here, except that 0.33.0's fp8_paged_mqa_logits_torch
slices `kv_cache[..., :D]` and `kv_cache[..., D:]` (token-interleaved) whenever next_n > 1, which
tests/difftest/backends/test_vllm.py pins down; 0.34.0's reads block-split at every next_n
(test_vllm_torch_ref.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from difftest.backends import deep_gemm, vllm_torch_ref, vllm_triton_decode
from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention

OPS = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
DEEP_GEMM = "vllm.utils.deep_gemm"
WORKSPACE = "vllm.v1.worker.workspace"
TRITON_UTILS = "vllm.triton_utils"
PLATFORM_UTILS = "vllm.utils.platform_utils"
# rocm_fp8_paged_mqa_logits_triton (rocm_aiter_mla_sparse.py:636-637 in vllm 0.33.0): BLOCK_KV = 64
# key positions per tile, and it asserts block_size % BLOCK_KV == 0.
TRITON_BLOCK_KV = 64


@functools.cache
def load(module: str) -> tuple[ModuleType | None, str | None]:
    """(the module, None), or (None, why not): vllm itself first, so a missing vllm reads as such."""
    try:
        vllm = importlib.import_module("vllm")
    except Exception as exc:  # a broken install raises more than ImportError
        return None, f"vllm not importable: {type(exc).__name__}: {exc}"
    if getattr(vllm, "__file__", None) is None:  # a carried kernel copy (vllm_triton_decode) is no vllm
        return None, f"vllm not importable: only directories without vllm/__init__.py: {list(vllm.__path__)}"
    try:
        return importlib.import_module(module), None
    except Exception as exc:
        return None, f"{module} not importable (vllm {vllm_version()}): {type(exc).__name__}: {exc}"


def vllm_version() -> str | None:
    """The installed vllm distribution's version, read without importing vllm; None if not installed."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_package() -> Path | None:
    """The vllm package `import vllm` takes (the one imported, if it is), found without running its
    __init__; None where there is none, or only folders without vllm/__init__.py (carried kernel
    copies, vllm_triton_decode, which import as a namespace package)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):  # a broken sys.modules entry, an unreadable path hook
        return None
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def vllm_library(entry: str) -> str:
    """'vllm 0.33.0 (ENTRY from /site-packages/vllm)', for the contract's `library`: the package's own
    vllm/_version.py first, as for AITER (a checkout first on sys.path shadows an installed vllm, whose
    metadata would name the wrong version), else the distribution's metadata."""
    package = vllm_package()
    if package is None:
        return f"vllm (not installed; {entry})"
    version = vllm_triton_decode.KernelTree(package.parent).version() or vllm_version() or "(version unknown)"
    return f"vllm {version} ({entry} from {package})"


def _module(name: str) -> ModuleType:
    module, why = load(name)
    if module is None:
        raise RuntimeError(why)
    return module


def _fp8_flavour() -> Fp8Flavour:
    """The fp8 bytes vLLM's ops module reads (its FP8_DTYPE: e4m3fnuz on gfx94x, e4m3fn elsewhere)."""
    module, _ = load(OPS)
    if module is not None and module.FP8_DTYPE == torch.float8_e4m3fnuz:
        return Fp8Flavour.E4M3FNUZ
    return Fp8Flavour.E4M3FN


def _gpu_reason(device: str, what: str) -> str | None:
    if device != "cuda":
        return f"{what} runs on GPUs only (device {device})"
    return hardware.cuda_unavailable_reason()


# --------------------------------------------------------------------------- vllm-torch-ref

def _torch_ref_contract() -> Contract:
    # A carried copy of the file (vllm_torch_ref) is read without vllm: its fp8 flavour is the platform's.
    tree = vllm_triton_decode.carried_tree()
    fp8 = _fp8_flavour() if tree is None else (
        Fp8Flavour.E4M3FNUZ if vllm_torch_ref.fp8_dtype() == torch.float8_e4m3fnuz else Fp8Flavour.E4M3FN)
    return Contract(
        length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
        # It starts from a -inf buffer and writes -inf past each row's limit.
        mask=MaskConvention.TAIL_NEG_INF, fp8=fp8, output_dtype=torch.float32,
        # float32 dot products and head sums: at most 1.1e-6 of the row's largest logit over the
        # default suite and the edges, next_n 1-4, on the CPU (2026-12-02).
        rtol=1e-5, devices=("cpu", "cuda"),
        # Envelope: none. A torch loop over sequences and blocks takes any shape; no tiles, no workers.
        library=vllm_library(vllm_torch_ref.FUNCTION) if tree is None else vllm_torch_ref.describe(tree))


def _torch_ref_reason(device: str) -> str | None:
    """The carried file's reasons when sys.path offers a copy of it first, else vLLM's."""
    tree = vllm_triton_decode.carried_tree()
    if tree is None:
        _, why = load(OPS)
        if why:
            return f"{why}; and no sys.path entry holds a copy of {vllm_triton_decode.FILE}"
    why = hardware.cuda_unavailable_reason() if device == "cuda" else None
    return why or (None if tree is None else vllm_torch_ref.reason(tree))


def _torch_ref_call(inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
    tree = vllm_triton_decode.carried_tree()
    if tree is not None:
        return vllm_torch_ref.call(tree, inputs)
    return _module(OPS).fp8_paged_mqa_logits_torch(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                                                   inputs.block_table, inputs.max_model_len)


def _torch_ref_prepare(inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
    """The whole call: the torch loop builds nothing once per batch."""
    return functools.partial(_torch_ref_call, inputs, out)


# --------------------------------------------------------------------------- vllm-triton-decode

def _triton_decode_contract() -> Contract:
    # A carried copy of the kernel file (vllm_triton_decode) runs on the CPU too, under the Triton
    # interpreter; vLLM itself swaps triton for a placeholder where there is no GPU driver.
    tree = vllm_triton_decode.carried_tree()
    fp8 = _fp8_flavour() if tree is None else (
        Fp8Flavour.E4M3FNUZ if vllm_triton_decode.on_gfx94x() else Fp8Flavour.E4M3FN)
    return Contract(
        length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
        # It stores only positions p < len of each row into a workspace buffer nobody cleans.
        mask=MaskConvention.TAIL_UNSPECIFIED, fp8=fp8, output_dtype=torch.float32,
        # Not measured (never run yet): DeepGEMM's margin for an fp8 MMA with fp32 accumulation.
        rtol=1e-2, devices=("cuda",) if tree is None else ("cpu", "cuda"),
        block_sizes=(TRITON_BLOCK_KV, 2 * TRITON_BLOCK_KV, 4 * TRITON_BLOCK_KV), head_dims=(32, 64, 128, 256),
        # tl.arange(0, NUM_HEADS) and tl.arange(0, HEAD_SIZE) need powers of two; tl.dot(kv, q^T) on
        # NVIDIA needs N = heads >= 16 and, for fp8, K = head_dim >= 32.
        heads_power_of_two=True, heads_multiple_of=16,
        tiles=(TRITON_BLOCK_KV,),
        # No partition: program `split` of a row takes tiles split, split + N_SPLITS, ... (strided,
        # rocm_aiter_mla_sparse.py:592), not a contiguous range, and N_SPLITS = min(CUs, tiles,
        # 1024 // rows) (line 661) changes with the batch. max_context and max_pool_bytes: none known
        # (page ids are widened to int64 before addressing the cache, line 600).
        writes_into_output=True,
        library=vllm_library("rocm_fp8_paged_mqa_logits_triton") if tree is None else tree.describe())


def _triton_decode_reason(device: str) -> str | None:
    """The carried kernel's reasons when sys.path offers a copy of its file first, else vLLM's."""
    tree = vllm_triton_decode.carried_tree()
    if tree is not None:
        return vllm_triton_decode.reason(tree, device)
    for module in (OPS, WORKSPACE, TRITON_UTILS):
        _, why = load(module)
        if why:
            return f"{why}; and no sys.path entry holds a copy of {vllm_triton_decode.FILE}"
    why = _gpu_reason(device, "vLLM's Triton decode kernel")
    if why:
        return why
    if not _module(TRITON_UTILS).HAS_TRITON:
        return "vllm.triton_utils.HAS_TRITON is False: vLLM replaced triton with its placeholder"
    arch = hardware.arch()
    if not hardware.is_rocm() and int(arch.removeprefix("sm")) < 89:
        return f"an fp8 tl.dot needs sm89 or newer, this GPU is {arch}"
    return None


def _triton_decode_call(inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
    """The workspace view the kernel writes is first filled with the engine's poisoned `out`, so
    positions it never stores stay poison."""
    assert out is not None, "writes_into_output: the engine passes a poisoned buffer"
    tree = vllm_triton_decode.carried_tree()
    if tree is not None:
        return vllm_triton_decode.call(tree, inputs, out)
    workspace = _workspace(inputs.q.device)
    rows = inputs.weights.shape[0]
    # The kernel's own get_simultaneous call of this shape returns this same view (offset 0).
    (buffer,) = workspace.current_workspace_manager().get_simultaneous(((rows, inputs.max_model_len), torch.float32))
    buffer.copy_(out)
    logits = _module(OPS).rocm_fp8_paged_mqa_logits_triton(inputs.q, inputs.kv_cache, inputs.weights,
                                                           inputs.context_lens, inputs.block_table,
                                                           inputs.max_model_len)
    return logits.clone()  # the workspace is reused by the next call


def _workspace(device: torch.device) -> ModuleType:
    """vLLM's workspace module, its manager initialised once per process as GPUModelRunner.__init__ does."""
    workspace = _module(WORKSPACE)
    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(device)
    return workspace


def _triton_decode_prepare(inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
    """The workspace set up now; each call launches the kernel into it as the indexer does, without
    the poison copy and the clone, which are difftest's own (for the verdict)."""
    tree = vllm_triton_decode.carried_tree()
    if tree is not None:
        assert out is not None, "writes_into_output: the engine passes a poisoned buffer"
        return vllm_triton_decode.prepare(tree, inputs, out)
    _workspace(inputs.q.device)
    return functools.partial(_module(OPS).rocm_fp8_paged_mqa_logits_triton, inputs.q, inputs.kv_cache,
                             inputs.weights, inputs.context_lens, inputs.block_table, inputs.max_model_len)


# --------------------------------------------------------------------------- vllm-deepgemm

def _deep_gemm_contract() -> Contract:
    module, how = deep_gemm.load_deep_gemm()
    source = f"vllm.utils.deep_gemm over {how}" if module is not None else "vllm.utils.deep_gemm"
    # The same kernel as `deepgemm`, on vLLM's native_next_n_supported path (sm90, next_n 1, 2, 4; it
    # flattens other next_n, which deepgemm-flattened covers): the same envelope.
    return deep_gemm.VARIANTS["deepgemm"].contract(vllm_library(source))


def _deep_gemm_reason(device: str) -> str | None:
    why = _gpu_reason(device, "DeepGEMM")
    if why:
        return why
    if hardware.arch() != "sm90":
        # sm100 decode goes through the varlen form (indices), which deepgemm-varlen covers.
        return f"vllm-deepgemm is vLLM's sm90 native path, this GPU is {hardware.arch()}"
    module, how = deep_gemm.load_deep_gemm()  # the order vLLM's _import_deep_gemm tries: deep_gemm, then its copy
    return None if module is not None else f"DeepGEMM not importable ({how})"


def _deep_gemm_call(inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
    lib = _module(DEEP_GEMM)
    return _deep_gemm_logits(lib, inputs, _deep_gemm_schedule(lib, inputs))


def _deep_gemm_prepare(inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
    """The schedule built now, as vLLM's metadata builder builds it once per step; each call is one
    layer's indexer call."""
    lib = _module(DEEP_GEMM)
    return functools.partial(_deep_gemm_logits, lib, inputs, _deep_gemm_schedule(lib, inputs))


def _deep_gemm_schedule(lib: ModuleType, inputs: KernelInputs) -> torch.Tensor:
    """The wrapper halves the schedule slots itself for sm90 next_n = 4: it gets the full SM count."""
    device = inputs.q.device.index if inputs.q.device.index is not None else torch.cuda.current_device()
    num_sms = _module(PLATFORM_UTILS).num_compute_units(device)  # what the metadata builder passes
    return lib.get_paged_mqa_logits_metadata(inputs.context_lens, inputs.block_size, num_sms)


def _deep_gemm_logits(lib: ModuleType, inputs: KernelInputs, schedule: torch.Tensor) -> torch.Tensor:
    """One layer's call: its q and weights made into the kernel's inputs, then the logits kernel."""
    q_scale, weights = lib.mqa_logits_mx_inputs(inputs.q, None, inputs.weights)
    return lib.fp8_fp4_paged_mqa_logits((inputs.q, q_scale), inputs.kv_cache, weights, inputs.context_lens,
                                        inputs.block_table, schedule, max_model_len=inputs.max_model_len,
                                        indices=None)


# --------------------------------------------------------------------------- the table

@dataclasses.dataclass(frozen=True)
class IndexerPath:
    """One of vLLM's paths: the modules it needs, its contract, what else stops it, how it is called."""

    modules: tuple[str, ...]  # vLLM modules that must import, checked first and in order
    contract: Callable[[], Contract]
    reason: Callable[[str], str | None]  # why not on this device, once the modules import
    call: Callable[[KernelInputs, torch.Tensor | None], torch.Tensor]
    # its per-batch set-up done once, then the per-layer call (Preparable)
    prepare: Callable[[KernelInputs, torch.Tensor | None], Callable[[], torch.Tensor]]
    rebuilt_every_step: str | None = None  # who rebuilds that set-up at every step (base.rebuilt_every_step)


PATHS: dict[str, IndexerPath] = {
    # Its reason checks vLLM's module itself: a carried copy of the file (vllm_torch_ref) needs none.
    "vllm-torch-ref": IndexerPath((), _torch_ref_contract, _torch_ref_reason, _torch_ref_call,
                                  _torch_ref_prepare),
    # Its reason checks vLLM's modules itself: a carried copy of the kernel file needs none of them.
    "vllm-triton-decode": IndexerPath((), _triton_decode_contract,
                                      _triton_decode_reason, _triton_decode_call, _triton_decode_prepare),
    "vllm-deepgemm": IndexerPath((DEEP_GEMM, PLATFORM_UTILS), _deep_gemm_contract, _deep_gemm_reason,
                                 _deep_gemm_call, _deep_gemm_prepare,
                                 rebuilt_every_step="vLLM's indexer metadata builder (every step)"),
}


class VllmIndexer:
    """One of vLLM's paged MQA logits paths (PATHS[name]), called as its indexer calls it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = PATHS[name]
        self.rebuilt_every_step = self.path.rebuilt_every_step

    @property
    def contract(self) -> Contract:
        """The path's contract; it reads vLLM's fp8 flavour and version when vllm is installed."""
        return self.path.contract()

    def unavailable_reason(self, device: str) -> str | None:
        """A vLLM module that does not import, else the path's own reason on `device`."""
        for module in self.path.modules:
            _, why = load(module)
            if why:
                return why
        return self.path.reason(device)

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [B * next_n, max_model_len] float32."""
        return self.path.call(inputs, out)

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The path's per-batch set-up done now; what is returned is its per-layer call (Preparable)."""
        return self.path.prepare(inputs, out)


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(VllmIndexer, name) for name in PATHS}
