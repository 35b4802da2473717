"""A fused, exact-product GPU oracle for ragged (prefill) MQA logits, with each row's fp32 rounding bound.

    logits[i, j] = sum_h w[i, h] * relu(q[i, h, :] . k[k_start[i] + j, :]) * k_scale[k_start[i] + j]
                   for j < k_end[i] - k_start[i], -inf for every other j < width

as difftest.oracles.ragged_mqa_logits states it, window-relative. One Triton program per (block of query rows,
chunk of the keys the block's windows span) computes every row and every head of its block, so a block's key
bytes are read once (the q blocks of DeepGEMM's sm90 kernel: 128 / H rows); no [rows, H, keys] tensor ever
reaches memory.

Exactness and the bound are those of the paged fused oracle (difftest.oracles.fused, docs/reference/kernel.md),
whose device functions this kernel shares: keys and queries decoded from fp8 to fp16 (exact), multiplied on
the tensor cores with fp32 accumulation (every product exact, only the sums round), ReLU, weights, head sum
and scale in fp32; bound[i] = bound_factor(H, D) * max over the window of (folded[i] . |k_p|) * s_p with
folded[i] = sum_h |w[i, h]| |q[i, h, :]|, computed by a second tensor-core product in the same pass and
rounded up wherever a rounding could lower it, so that a correct fp32 backend stays within bound[i] of this
oracle. The arithmetic per logit is the paged kernel's (one D-term dot per head, H + 1 fp32 operations
after it), so the same gamma holds. 0 for an empty window.

Memory: the float32 logits [rows, width] (filled with -inf first, then each window's positions written), one
int32 per row for the bound's running maximum, and the float32 bound: nothing of size rows x keys or heads
x keys. A row's values and bound depend only on its own window and q, not on the rows beside it in its block:
a case `shrink` reduces keeps its oracle values (under the interpreter, up to the order numpy's matmul sums
a product in, inside the bound).

On a CUDA case the kernel is compiled for the GPU; on a CPU case it runs under the Triton interpreter.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from difftest.core.kinds import Fp8Flavour
from difftest.core.ragged import RaggedCase
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module
from difftest.oracles.fused import FusedReference, bound_factor

KERNEL_FILE = Path(__file__).with_name("_ragged_mqa_logits_kernel.py")
DEFAULT_CHUNK_TILES = 32  # key tiles per program on a GPU: a block's range is cut into chunks of this many
_MAX_KEYS = 2 ** 31 - 1024  # key positions are int32 in the kernel (byte offsets are int64)


@dataclasses.dataclass(frozen=True)
class RaggedKernelConfig:
    """Tile shape and launch parameters. None of them changes a value, except that under the interpreter
    the tile shape may reorder a product's sums (numpy's matmul), inside the bound."""

    block_m: int  # query rows per program (a power of two)
    block_n: int  # keys per tile (a power of two, >= 16)
    num_warps: int
    num_stages: int  # software-pipelining depth of the key loads (compiled mode)
    chunk_tiles: int | None = None  # tiles per program; None: DEFAULT_CHUNK_TILES compiled, every tile interpreted
    tma: bool | None = None  # bulk tensor copies of whole tiles; None: wherever D is a power of two

    def uses_tma(self, case: RaggedCase) -> bool:
        """Tiles by tensor descriptors: D a power of two (a descriptor's block shape must be)."""
        fits = case.head_dim == triton.next_power_of_2(case.head_dim)
        return fits if self.tma is None else self.tma and fits


def default_config(case: RaggedCase, interpret: bool) -> RaggedKernelConfig:
    """DeepGEMM's q blocks on a GPU (128 / H rows, so a block's score tile has 128 columns), 64-key tiles;
    interpreted, few wide programs (the interpreter's cost is per operation, not per element)."""
    h_pad = triton.next_power_of_2(case.heads)
    if interpret:
        return RaggedKernelConfig(block_m=max(1, min(8, 256 // h_pad)), block_n=128, num_warps=4, num_stages=1)
    return RaggedKernelConfig(block_m=max(1, 128 // h_pad), block_n=64, num_warps=4, num_stages=3)


def fused_ragged_reference(case: RaggedCase, width: int | None = None,
                           config: RaggedKernelConfig | None = None) -> FusedReference:
    """Window-relative logits [rows, width] (default: the case's max_seqlen_k, or its longest window) and the
    per-row bound of `case`, on the case's device (interpreted when it is the CPU)."""
    return prepared(case, width, config)()


def prepared(case: RaggedCase, width: int | None = None,
             config: RaggedKernelConfig | None = None) -> Callable[[], FusedReference]:
    """fused_ragged_reference(case, width, config) as a call that reads nothing back to the host: what needs a
    host read (the longest key span of a q block, which sizes the grid) is read now, once. On a GPU the call
    can be captured in a CUDA graph (bench/ragged_oracle.py times its replay)."""
    if case.keys > _MAX_KEYS:
        raise ValueError(f"{case.keys} keys need int64 key positions (the kernel's are int32)")
    width = case.seqlen_k if width is None else width
    interpret = case.device.type == "cpu"
    kernels = load_kernel_module(KERNEL_FILE, "difftest_fused_ragged_oracle", interpret)
    config = config or default_config(case, interpret)
    launch = _launcher(kernels, case, config, interpret, width)
    factor = bound_factor(case.heads, case.head_dim)

    def call() -> FusedReference:
        logits = torch.full((case.rows, width), -math.inf, dtype=torch.float32, device=case.device)
        peaks = torch.zeros(case.rows, dtype=torch.int32, device=case.device)  # float32 bits, >= 0
        with interpreter_compat() if interpret else torch.cuda.device(case.device):
            launch(logits, peaks)
        # One rounding (fp32 multiply) covered by bound_factor's slack: the bound stays an upper bound.
        return FusedReference(logits=logits, bound=peaks.view(torch.float32) * factor)

    return call


def _launcher(kernels: object, case: RaggedCase, config: RaggedKernelConfig, interpret: bool,
              width: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """What launches the kernel into (logits, peaks): nothing where every window is empty (the -inf fill is
    the answer and every bound 0)."""
    span = _longest_block_span(case, config, width)
    if span == 0:
        return lambda logits, peaks: None
    tiles = triton.cdiv(span, config.block_n)
    chunk_tiles = tiles if config.chunk_tiles is None and interpret else config.chunk_tiles or DEFAULT_CHUNK_TILES
    chunk = min(chunk_tiles, tiles) * config.block_n
    grid = (triton.cdiv(case.rows, config.block_m), triton.cdiv(span, chunk))
    keys, scales = _key_sources(case, config)
    q, weights = case.q.contiguous(), case.weights.contiguous()
    starts, ends = case.k_start.to(torch.int32).contiguous(), case.k_end.to(torch.int32).contiguous()
    constants = dict(H=case.heads, D=case.head_dim, BLOCK_M=config.block_m, H_PAD=triton.next_power_of_2(case.heads),
                     D_PAD=max(16, triton.next_power_of_2(case.head_dim)), NF=max(16, config.block_m),
                     BLOCK_N=config.block_n, TMA=config.uses_tma(case), FNUZ=case.fp8 == Fp8Flavour.E4M3FNUZ,
                     FIX_NAN=interpret, NUM_STAGES=config.num_stages, num_warps=config.num_warps)

    def launch(logits: torch.Tensor, peaks: torch.Tensor) -> None:
        kernels.logits_kernel[grid](q, keys, scales, weights, starts, ends, logits, peaks, case.rows, case.keys,
                                    width, chunk, **constants)

    return launch


def _longest_block_span(case: RaggedCase, config: RaggedKernelConfig, width: int) -> int:
    """The most keys a q block's windows span, from its least start rounded down to a tile (as the kernel
    starts) to its greatest end; one host read."""
    blocks = triton.cdiv(case.rows, config.block_m)
    pad = blocks * config.block_m - case.rows
    starts = torch.nn.functional.pad(case.k_start, (0, pad)).reshape(blocks, config.block_m)
    ends = torch.minimum(torch.nn.functional.pad(case.k_end, (0, pad)).reshape(blocks, config.block_m), starts + width)
    nonempty = ends > starts
    lo = torch.where(nonempty, starts, case.keys).amin(dim=1) // config.block_n * config.block_n
    hi = torch.where(nonempty, ends, 0).amax(dim=1)
    return int((hi - lo).clamp(min=0).max())


def _key_sources(case: RaggedCase, config: RaggedKernelConfig) -> tuple[object, object]:
    """Keys and scales as the kernel reads them: tensor descriptors, or the tensors."""
    keys, scales = case.k.contiguous(), case.k_scale.contiguous()
    if not config.uses_tma(case):
        return keys, scales
    return (TensorDescriptor.from_tensor(keys, [config.block_n, case.head_dim]),
            TensorDescriptor.from_tensor(scales, [config.block_n]))
