"""FlashInfer 0.7.2.post1's paged MQA logits (flashinfer-python): the CuTe-DSL kernel, which runs on
Blackwell and Rubin only, and the pure-torch reference FlashInfer traces it against, which runs anywhere.

* flashinfer      flashinfer/attn_scores/attn_scores.py:1596 `fp8_paged_mqa_logits(q, kv_fused, weights,
                  block_tables, seq_lens, max_seq_len, *, ..., schedule_meta=None, out=None)`, from the
                  installed flashinfer package. Its support check is decorated
                  `supported_compute_capability([100, 103, 107])` (:759, :1455) and the kernel needs a
                  nvidia-cutlass-dsl that targets the GPU natively: no sm90, so on the H200 it is a SKIP.
                  Called as vLLM's Step5 calls it off sm90 (vllm 0.34.0 vllm/models/step5/nvidia/
                  flashinfer_sparse.py:46-51, :203-217, :351-359): keywords, the schedule built once per
                  batch with `compute_paged_mqa_logits_schedule(seq_lens)` (:1356).
* flashinfer-ref  flashinfer/trace/templates/attn_scores.py:88-150 `_fp8_paged_mqa_logits_reference(q,
                  kv_fused, weights, block_tables, seq_lens, max_seq_len)`, executed verbatim from the file
                  (difftest.core.triton_interpret.load_kernel_defs; the file's other definitions import the
                  rest of flashinfer). A per-sequence, per-block torch loop: CPU and GPU.

Both read FlashInfer's argument order (block_tables before seq_lens) and one length L per sequence; row
b * next_n + t sees positions p < L - next_n + t + 1 (the reference's `kpos <= q_pos`, :124-131; the
kernel's docstring :1814): the per-sequence encoding. The cache is block-split (:69-80, the reference's
unpacking :106-117). The kernel leaves columns past each row's window unspecified and never writes rows
of a zero-length sequence (:1814-1820); the reference starts from -inf (:121-123) and writes -inf past
every window. The kernel's output is a view `[:, :max_seq_len]` of rows padded to a multiple of 256
(padded_seq_len, :1313-1330); its 32-bit output offsets need rows * padded < 2^31 (documented).

Which copy of the reference: the first sys.path entry holding its file (difftest.backends.carried).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import zlib
from collections.abc import Callable
from types import ModuleType

import torch

from difftest.backends import carried
from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract, WorkPartition
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention, PartitionScope
from difftest.core.triton_interpret import load_kernel_defs

RELEASE = "flashinfer-python 0.7.2.post1"
REFERENCE_FILE = "flashinfer/trace/templates/attn_scores.py"
REFERENCE = "_fp8_paged_mqa_logits_reference"
VERSION_FILES = ("flashinfer/_build_meta.py",)
# attn_scores.py:759 _PAGED_MQA_CCS = [100, 103, 107]
ARCHS = ("sm100", "sm103", "sm107")
COMPUTE_BLOCK_KV = 128  # :800 the kernel's compute tile
SPLIT_KV = 256  # :1262 _SPLIT_KV = _COMPUTE_BLOCK_KV * _NUM_MATH_WG: output padding and schedule unit


@dataclasses.dataclass(frozen=True)
class Variant:
    """The kernel or its reference."""

    contract: Callable[[], Contract]  # its envelope, naming what was found
    reason: Callable[[str], str | None]  # device -> why it cannot run there
    call: Callable[[KernelInputs], Callable[[], torch.Tensor]]  # inputs -> the per-layer call


# --------------------------------------------------------------------------- the CuTe-DSL kernel

def _kernel_contract() -> Contract:
    # Envelope from _check_fp8_paged_mqa_logits_supported (:1455-1591): D a multiple of 32 (:1533) and
    # within the shared memory (D <= 192 at H 64, :1540-1552); N = next_n * H a multiple of 8 in [8, 256]
    # (:1556-1566); H a multiple of 4 (:1569); block size 32, 64 or 128 (_validate_phys_block_kv).
    # Declared as values for which every combination holds: H 8 to 64 and next_n 1 to 4 give N in [8, 256].
    return Contract(
        length_encoding=LengthEncoding.PER_SEQUENCE, cache_layout=CacheLayout.BLOCK_SPLIT,
        mask=MaskConvention.TAIL_UNSPECIFIED, fp8=Fp8Flavour.E4M3FN, output_dtype=torch.float32,
        rtol=1e-2,  # an fp8 MMA with fp32 accumulation: DeepGEMM's margin; never run here (no sm100)
        devices=("cuda",), archs=ARCHS, next_n=(1, 2, 3, 4), heads=(8, 16, 32, 64), head_dims=(32, 64, 128),
        block_sizes=(32, 64, 128), tiles=(COMPUTE_BLOCK_KV, SPLIT_KV),
        # compute_paged_mqa_logits_schedule: ceil(L / 256) units per sequence laid end to end, the first
        # `total % num_sms` SMs one unit more (_compute_schedule_metadata, :854-911, and its GPU twin).
        partition=WorkPartition(SPLIT_KV, PartitionScope.GLOBAL, workers=None),
        library=_kernel_library(), batchable=True)


def _kernel_library() -> str:
    """The installed flashinfer's version, read without importing it (importing needs its JIT deps)."""
    try:
        return f"flashinfer-python {importlib.metadata.version('flashinfer-python')} (flashinfer.attn_scores)"
    except importlib.metadata.PackageNotFoundError:
        return "flashinfer-python (not installed)"


def _kernel_reason(device: str) -> str | None:
    if device != "cuda":
        return f"FlashInfer's fp8_paged_mqa_logits runs on {'/'.join(ARCHS)} GPUs only (device {device})"
    why = hardware.cuda_unavailable_reason()
    if why:
        return why
    if hardware.arch() not in ARCHS:
        return (f"FlashInfer's fp8_paged_mqa_logits runs on {'/'.join(ARCHS)} only (attn_scores.py:759), "
                f"this GPU is {hardware.arch()}")
    try:
        module = importlib.import_module("flashinfer.attn_scores")
    except Exception as exc:  # its JIT dependencies (cutlass-dsl, tvm-ffi) can fail in any way
        return f"flashinfer.attn_scores not importable: {type(exc).__name__}: {exc}"
    missing = [n for n in ("fp8_paged_mqa_logits", "compute_paged_mqa_logits_schedule") if not hasattr(module, n)]
    return f"flashinfer.attn_scores defines no {', '.join(missing)}" if missing else None


def _kernel_call(inputs: KernelInputs) -> Callable[[], torch.Tensor]:
    """The schedule once per batch (as Step5's prefill_pair_inputs builds it), then the kernel per layer."""
    module = importlib.import_module("flashinfer.attn_scores")
    schedule = module.compute_paged_mqa_logits_schedule(inputs.context_lens)
    return functools.partial(module.fp8_paged_mqa_logits, q=inputs.q, kv_fused=inputs.kv_cache,
                             weights=inputs.weights, block_tables=inputs.block_table, seq_lens=inputs.context_lens,
                             max_seq_len=inputs.max_model_len, schedule_meta=schedule)


# --------------------------------------------------------------------------- the torch reference

def _reference_contract() -> Contract:
    return Contract(
        length_encoding=LengthEncoding.PER_SEQUENCE, cache_layout=CacheLayout.BLOCK_SPLIT,
        mask=MaskConvention.TAIL_NEG_INF, fp8=Fp8Flavour.E4M3FN, output_dtype=torch.float32,
        # fp32 matmul of exact fp8 values (:128), fp32 weights, head sum and scale (:130-133): within the
        # oracle's fp32 rounding bound, which the comparison allows whatever rtol says.
        rtol=1e-5, devices=("cpu", "cuda"),
        # No envelope: a loop over sequences and blocks (:119-145) takes any H, D, next_n and block size.
        library=_reference_library(), batchable=True)


def _find_reference() -> carried.CarriedFile | None:
    return carried.find((REFERENCE_FILE,))


def _reference_library() -> str:
    found = _find_reference()
    if found is None:
        return f"flashinfer-python (no copy of {REFERENCE_FILE} on sys.path)"
    return (f"flashinfer-python {found.version(VERSION_FILES) or '(version unknown)'} ({REFERENCE} from "
            f"{found.path}, flashinfer not imported)")


def load_reference(found: carried.CarriedFile) -> ModuleType:
    """The reference function from the file found, as a module (one per file)."""
    name = f"difftest_flashinfer_{zlib.crc32(str(found.path).encode()):08x}"
    return load_kernel_defs(found.path, (REFERENCE,), name, False, {"torch": torch})


def _reference_reason(device: str) -> str | None:
    if device not in ("cpu", "cuda"):
        return f"device {device!r} is neither 'cpu' nor 'cuda'"
    why = hardware.cuda_unavailable_reason() if device == "cuda" else None
    found = _find_reference()
    if why or found is None:
        return why or carried.missing_reason((REFERENCE_FILE,), RELEASE)
    try:
        load_reference(found)
    except Exception as exc:  # a file without the function, a syntax this Python lacks
        return f"loading {REFERENCE} from {found.path} failed: {type(exc).__name__}: {exc}"
    return None


def _reference_call(inputs: KernelInputs) -> Callable[[], torch.Tensor]:
    found = _find_reference()
    if found is None:
        raise RuntimeError(carried.missing_reason((REFERENCE_FILE,), RELEASE))
    return functools.partial(getattr(load_reference(found), REFERENCE), inputs.q, inputs.kv_cache, inputs.weights,
                             inputs.block_table, inputs.context_lens, inputs.max_model_len)


VARIANTS: dict[str, Variant] = {
    "flashinfer": Variant(_kernel_contract, _kernel_reason, _kernel_call),
    "flashinfer-ref": Variant(_reference_contract, _reference_reason, _reference_call),
}


class FlashInfer:
    """The kernel or its torch reference (VARIANTS[name])."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.variant = VARIANTS[name]

    @property
    def contract(self) -> Contract:
        """The variant's envelope; `library` names what was found."""
        return self.variant.contract()

    def unavailable_reason(self, device: str) -> str | None:
        """Why the variant cannot run on `device`, most basic cause first; None when it can."""
        return self.variant.reason(device)

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits [rows, max_model_len] float32."""
        return self.prepare(inputs, out)()

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """What the caller builds once per batch (the kernel's schedule), done now; the per-layer call
        returned (Preparable)."""
        return self.variant.call(inputs)


BACKENDS: dict[str, Callable[[], Backend]] = {name: functools.partial(FlashInfer, name) for name in VARIANTS}
