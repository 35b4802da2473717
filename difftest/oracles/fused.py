"""A fused, exact-product GPU oracle for paged MQA logits, with each row's fp32 rounding bound.

    logits[b*next_n + j, p] = sum_h w[b*next_n + j, h] * relu(q[b, j, h, :] . k_b[p, :]) * s_b[p]
                              for p < limit[b, j] = max(L_b - next_n + j + 1, 0),
                              -inf for every other p < max_model_len

k_b[p], s_b[p]: slot p % block_size of physical block block_table[b, p // block_size]. One Triton
program per (sequence, chunk of key positions) computes every next_n row and every head of its
sequence, so each key byte is read once; no [rows, H, positions] tensor ever reaches memory.

Exactness. Keys and queries are decoded from fp8 to fp16, which holds every e4m3fn and e4m3fnuz
value exactly (as bf16 does; fp16 is used because the hardware converts e4m3 pairs to it in one
instruction), and multiplied on the tensor cores with fp32 accumulation: every product q_d * k_d
(at most 8 significant bits) is exact, so the only errors are the fp32 sums, the same class of
error a correct fp32 kernel makes. (fp8 tensor-core products are not used: Hopper's fp8 MMA keeps
only ~14 accumulator bits.) ReLU, weights, head sum and scale are fp32 CUDA-core operations.
Where every partial sum is representable (small integers, power-of-two scales) the logits are
bit-equal to the float64 oracle's rounded to float32.

The bound. bound[r] = gamma * max_{p < limit} (folded[r] . |k_p|) * s_p with
folded[r, :] = sum_h |w[r, h]| * |q[r, h, :]|, so that for every p < limit
|fused[r, p] - exact[r, p]| + |fp32 backend[r, p] - exact[r, p]| <= bound[r]: a correct fp32 backend
stays within bound[r] of this oracle (see `bound_gamma` for gamma). It is computed in the same
pass, by a second tensor-core product of |k| with folded (scaled by a power of two and rounded up
to fp16), and every rounding that could lower it is paid for by `peak_inflation` and
`bound_factor`, so it is an upper bound, not an estimate, barring fp32 underflow (magnitudes
below 2^-126, far from any logit the indexer produces). It is 0 for rows with an empty window.

Memory. Beyond the float32 logits the call allocates one int32 per row (the bound's running
maximum) and the float32 bound: nothing of size rows x positions or heads x positions.

Shrink-free. Nothing here depends on the whole batch beyond each row's own sequence: a row's logits
and bound are the same whether its sequence is alone or in a batch of 128, whatever the other
sequences' lengths, the pool's size or the table's width, so a case `difftest shrink` reduces keeps
its oracle values. The chunking of positions and the order of the atomic max change no value. The tile
size (block_p) can change the last bits under the interpreter, whose products are numpy's float32
matmuls: a BLAS may order a row's sum by the matrix's size (OpenBLAS's AVX-512 kernels do), and the
interpreted tile follows max_model_len. Every order stays inside the bound.

On a CUDA case the kernels are compiled for the GPU; on a CPU case they run under the Triton
interpreter (numpy float32: products exact, sums round to nearest, inside the same bound).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, CompiledKernel
from triton.tools.tensor_descriptor import TensorDescriptor

from difftest.core import hardware
from difftest.core.case import Case
from difftest.core.kinds import Fp8Flavour
from difftest.core.triton_interpret import interpreter_compat, load_kernel_module

KERNEL_FILE = Path(__file__).with_name("_paged_mqa_logits_kernel.py")

# Unit roundoffs. Plain fp32 arithmetic rounds to nearest: 2^-24. NVIDIA documents no rounding
# mode for the tensor cores' fp32 accumulation; measurements (Fasi, Higham, Mikaitis, Pranesh 2021
# on V100/T4/A100, and later work on Hopper) found truncation, i.e. round toward zero, whose unit
# roundoff is 2^-23, twice round-to-nearest's; and a multi-term adder truncates each addend when it
# aligns it, so we count two such roundings per product.
U_FP32 = 2.0 ** -24
U_TENSOR_CORE = 2.0 ** -23
# fp32 rounding of peak * factor loses at most 2^-24 of it; the float64 arithmetic of the factor
# itself a few 2^-53: a relative slack of 2^-22 covers both.
_PRODUCT_SLACK = 2.0 ** -22


MAX_DEFAULT_CHUNK_TILES = 32  # tiles per program at most, unless a KernelConfig asks for more


@dataclasses.dataclass(frozen=True)
class FusedReference:
    """The oracle's answer for one case."""

    logits: torch.Tensor  # float32 [rows, max_model_len], -inf outside each row's window
    bound: torch.Tensor  # float32 [rows]: largest |fused - fp32 backend| a correct backend may show


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters. None of them changes a value, except that under the interpreter
    the tile size (block_p) may reorder a product's sums (see the module's docstring)."""

    block_p: int  # key positions per tile (a power of two, >= 16)
    num_warps: int
    num_stages: int  # software-pipelining depth of the key loads (compiled mode)
    chunk_tiles: int | None = None  # tiles per program; None: from the case's size and the GPU
    tma: bool | None = None  # bulk tensor copies of whole tiles; None: wherever a tile fits in a block
    maxnreg: int | None = None  # register cap per thread (more programs per SM), compiled mode only

    def uses_tma(self, case: Case) -> bool:
        """Tiles by tensor descriptors: each tile inside one block, and D a power of two."""
        fits = case.block_size % self.block_p == 0 and case.head_dim == triton.next_power_of_2(case.head_dim)
        return fits if self.tma is None else self.tma and fits


def gamma(n: int, unit: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): relative error of n roundings of unit u."""
    return n * unit / (1 - n * unit)


def bound_gamma(heads: int, head_dim: int) -> float:
    """gamma with |fused - exact| + |fp32 backend - exact| <= gamma * (folded . |k_p|) * s_p.

    A correct fp32 backend, in any order (Higham 3.1, as difftest.oracles.paged_mqa_logits.fp32_error_bound):
    gamma_{D+H+3}(2^-24). This oracle: the D-term dot on tensor cores, two roundings of 2^-23 per
    product (U_TENSOR_CORE), then x weight, the H-term head sum and x scale in fp32 (H + 1 roundings
    of 2^-24). With u = 2^-23 in gamma_{D+H+3} alone (twice the fp32 bound) the sum would not be
    covered when the tensor cores truncate: this oracle's part is ~4D + H units of 2^-24, not D + H.
    """
    backend = gamma(head_dim + heads + 3, U_FP32)
    oracle = (1 + gamma(2 * head_dim, U_TENSOR_CORE)) * (1 + gamma(heads + 1, U_FP32)) - 1
    return backend + oracle


def peak_inflation(heads: int, head_dim: int) -> float:
    """Factor >= true peak / computed peak: the computed peak only loses what its roundings lose.

    folded is an H-term fp32 sum of products (>= (1 - gamma_H) of its value), then scaled by a power
    of two and rounded up to fp16 (never lower); its dot with |k| on the tensor cores loses at most
    gamma_{2D}(2^-23) of a sum of non-negative terms; x scale one more 2^-24.
    """
    kept = (1 - gamma(heads, U_FP32)) * (1 - gamma(2 * head_dim, U_TENSOR_CORE)) * (1 - U_FP32)
    return 1 / kept


@functools.cache
def bound_factor(heads: int, head_dim: int) -> float:
    """gamma * peak_inflation, with slack for the one fp32 rounding of peak * factor, rounded up to a float32.

    The returned Python float is exactly a float32, so torch multiplies by it without rounding it.
    """
    wanted = bound_gamma(heads, head_dim) * peak_inflation(heads, head_dim) * (1 + _PRODUCT_SLACK)
    single = np.float32(wanted)
    return float(single if float(single) >= wanted else np.nextafter(single, np.float32(np.inf)))


def fused_reference(case: Case, config: KernelConfig | None = None) -> FusedReference:
    """Logits and per-row bound of `case`, on the case's device (interpreted when it is the CPU)."""
    logits = torch.empty((case.rows, case.max_model_len), dtype=torch.float32, device=case.device)
    peaks = torch.zeros(case.rows, dtype=torch.int32, device=case.device)  # float32 bits, >= 0
    with _Launch.of(case, config, logits, peaks) as launch:
        launch.run()
    # One rounding (fp32 multiply) covered by bound_factor's slack: the bound stays an upper bound.
    return FusedReference(logits=logits, bound=peaks.view(torch.float32) * bound_factor(case.heads, case.head_dim))


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How fused_reference splits a case into programs."""

    tiles: int  # key tiles per program
    at_once: int | None  # programs the GPU runs at once (None: interpreted, or a config's own chunk)


def launch_plan(case: Case, config: KernelConfig | None = None) -> LaunchPlan:
    """How fused_reference(case, config) splits the case (on a GPU this compiles its kernel)."""
    nowhere = torch.empty(0, dtype=torch.float32, device=case.device)
    with _Launch.of(case, config, nowhere, nowhere.view(torch.int32)) as launch:
        wave_sized = not launch.interpret and launch.config.chunk_tiles is None
        return LaunchPlan(launch.tiles(), launch.resident() if wave_sized else None)


def compiled_offline(case: Case, config: KernelConfig | None = None, arch: int = 90) -> CompiledKernel:
    """The logits kernel `fused_reference(case.to("cuda"), config)` launches for the default chunk, compiled
    here for an NVIDIA GPU of compute capability `arch` (90: Hopper), GPU or not: Triton's compiler and the
    ptxas it ships need none. Its `asm` holds the TTGIR, PTX and cubin: registers, spills and what the loop
    does, read without the device (scripts/fused_kernel_report.py)."""
    kernels = load_kernel_module(KERNEL_FILE, "difftest_fused_oracle", interpret=False)
    nowhere = torch.empty(0, dtype=torch.float32)
    launch = _Launch(kernels, case, config or default_config(case, interpret=False), nowhere,
                     nowhere.view(torch.int32), interpret=False)
    constants = launch._constants(MAX_DEFAULT_CHUNK_TILES)
    options = {name: constants.pop(name) for name in ("num_warps", "maxnreg") if name in constants}
    fn = kernels.logits_kernel
    values = dict(zip(fn.arg_names, launch._arguments(MAX_DEFAULT_CHUNK_TILES), strict=False))
    index = {name: (fn.arg_names.index(name),) for name in fn.arg_names}
    # What a launch specializes on, as Triton's launcher does: 16-byte-aligned pointers, multiples of 16.
    aligned = {index[name]: [["tt.divisibility", 16]] for name, value in values.items()
               if isinstance(value, torch.Tensor) or (isinstance(value, int) and value % 16 == 0
                                                      and name not in fn.do_not_specialize)}
    signature = {name: _triton_type(value) for name, value in values.items()} | dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn, signature, {index[name]: value for name, value in constants.items()}, aligned)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def _triton_type(value: object) -> str:
    """Triton's signature type of a launch argument: a tensor's pointer, a descriptor's block, an int32."""
    names = {torch.uint8: "u8", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64"}
    if isinstance(value, torch.Tensor):
        return "*" + names[value.dtype]
    if isinstance(value, TensorDescriptor):
        return f"tensordesc<{names[value.base.dtype]}[{', '.join(map(str, value.block_shape))}]>"
    return "i32"


# --------------------------------------------------------------------------- shapes and configs

@dataclasses.dataclass(frozen=True)
class _Shape:
    """Power-of-two paddings the kernels' tl.arange and tl.dot need (padding holds zeros)."""

    next_n_pad: int
    h_pad: int
    d_pad: int
    nf: int  # columns of the bound's product: next_n padded to tl.dot's minimum of 16

    @classmethod
    def of(cls, case: Case) -> _Shape:
        next_n_pad = triton.next_power_of_2(case.next_n)
        # tl.dot needs N >= 16: widen the head padding for tiny next_n * H.
        h_pad = max(triton.next_power_of_2(case.heads), 16 // min(next_n_pad, 16), 1)
        return cls(next_n_pad=next_n_pad, h_pad=h_pad, d_pad=max(triton.next_power_of_2(case.head_dim), 16),
                   nf=max(16, next_n_pad))


def default_config(case: Case, interpret: bool) -> KernelConfig:
    """The tile shape per width of the score tile (next_n * H columns)."""
    if interpret:
        # Few, wide programs: the interpreter's cost is per operation, not per element.
        return KernelConfig(block_p=min(256, max(16, triton.next_power_of_2(case.max_model_len))),
                            num_warps=4, num_stages=1)
    # One warpgroup (4 warps) per 64-key tile. Measured on the H200 (bench/README.md): 4 warps
    # beat 8 at every width, 256 score columns (next_n 4, H 64) included, where the accumulators spill
    # a little but two programs fit an SM instead of one; at 128 columns a 168-register cap fits three
    # programs per SM instead of two (0.73 -> 0.57 ms at B 40, 120K). Three pipeline stages (two key
    # tiles in flight a program) since the block ids sit in registers (see _sweep_tiles_tma): 0.467 ->
    # 0.386, 0.115 -> 0.098, 0.048 -> 0.040 ms at the three bench shapes; four stages were no faster.
    shape = _Shape.of(case)
    columns = shape.next_n_pad * shape.h_pad
    return KernelConfig(block_p=64, num_warps=4, num_stages=3, maxnreg=168 if columns == 128 else None)


def _chunk_tiles(case: Case, config: KernelConfig, interpret: bool, slots: Callable[[], int]) -> int:
    """Tiles per program: the config's, the whole row when interpreted, else what fills whole waves
    of the `slots()` programs the GPU runs at once (_wave_tiles)."""
    tiles_per_row = triton.cdiv(case.max_model_len, config.block_p)
    if config.chunk_tiles is not None:
        return max(1, min(config.chunk_tiles, tiles_per_row))
    if interpret:
        return tiles_per_row
    return _wave_tiles(tiles_per_row, case.batch, slots())


# A program's fixed cost (loading and folding its q tile, the -inf tail, the peak's atomics) in tiles: an
# estimate. The H200 sweep at B 40 (bench/README.md: 16 and 20 tiles a program against 32) puts it
# between 1 and 4 tiles; every value in that range picks the same chunks at the bench's three shapes.
PROLOGUE_TILES = 2


def _wave_tiles(tiles_per_row: int, sequences: int, slots: int) -> int:
    """Tiles per program (at most MAX_DEFAULT_CHUNK_TILES) that end the launch soonest, counting each
    program as its tiles plus PROLOGUE_TILES and the launch as whole waves of `slots` programs (the
    ones that fit on the GPU at once). Ties go to fewer, longer programs.

    Programs of one launch run about equally long, so a last wave with few programs costs nearly as
    much as a full one. On the H200 at B 16, next_n 4, 32K (512 tiles a row, 2 programs an SM): 32
    tiles a program, one wave of 256 programs, 0.089 ms; 16 tiles, two waves of 512, 0.098 ms; 31
    tiles, 272 programs, 0.113 ms. At B 40, 120000 (1875 tiles a row, 3 programs an SM): 32 tiles, 5.96
    waves, 0.380 ms; 28 tiles, 6.77 waves, 0.391 ms (bench/README.md).
    """
    def tile_times(tiles: int) -> int:
        waves = triton.cdiv(sequences * triton.cdiv(tiles_per_row, tiles), slots)
        return waves * (tiles + PROLOGUE_TILES)

    return min(range(min(MAX_DEFAULT_CHUNK_TILES, tiles_per_row), 0, -1), key=tile_times)


# --------------------------------------------------------------------------- launches

@dataclasses.dataclass
class _Launch:
    """One launch of the logits kernel on a case, into `logits` and `peaks`."""

    kernels: object
    case: Case
    config: KernelConfig
    logits: torch.Tensor
    peaks: torch.Tensor
    interpret: bool

    @classmethod
    @contextlib.contextmanager
    def of(cls, case: Case, config: KernelConfig | None, logits: torch.Tensor,
           peaks: torch.Tensor) -> Iterator[_Launch]:
        """The launch, inside the context its kernels run in (the case's GPU, or the interpreter)."""
        interpret = case.device.type == "cpu"
        kernels = load_kernel_module(KERNEL_FILE, "difftest_fused_oracle", interpret)
        context = interpreter_compat() if interpret else torch.cuda.device(case.device)
        with context:
            yield cls(kernels, case, config or default_config(case, interpret), logits, peaks, interpret)

    def run(self) -> None:
        tiles = self.tiles()
        chunks = triton.cdiv(self.case.max_model_len, tiles * self.config.block_p)
        self.kernels.logits_kernel[(chunks * self.case.batch,)](*self._arguments(tiles), **self._constants(tiles))

    def tiles(self) -> int:
        return _chunk_tiles(self.case, self.config, self.interpret, self.resident)

    def resident(self) -> int:
        """Programs of the kernel the GPU runs at once: per SM by its registers, shared memory and
        threads, times the SMs; four an SM where the GPU does not say (ROCm). The chunk is a plain
        argument: every default chunk (<= MAX_DEFAULT_CHUNK_TILES tiles) shares one compiled kernel."""
        constants = self._constants(MAX_DEFAULT_CHUNK_TILES)
        device = self.case.device
        index = torch.cuda.current_device() if device.index is None else device.index
        key = (index, tuple(sorted(constants.items())))
        if key not in _RESIDENT:
            compiled = self.kernels.logits_kernel.warmup(*self._arguments(MAX_DEFAULT_CHUNK_TILES), grid=(1,),
                                                         **constants)
            _ = compiled.run  # loads the binary: its register count is known from then on
            limits = hardware.SmLimits.of(index)
            per_sm = 4 if limits is None else limits.resident_blocks(
                compiled.metadata.num_warps * 32, compiled.n_regs, compiled.metadata.shared)
            _RESIDENT[key] = per_sm * hardware.sm_count(index)
        return _RESIDENT[key]

    def _arguments(self, tiles: int) -> tuple[object, ...]:
        case, config = self.case, self.config
        table = case.block_table.contiguous()
        keys, scales = _pool_sources(case, config.block_p, config.uses_tma(case))
        chunk = tiles * config.block_p
        return (case.q.contiguous(), keys, scales, case.weights.contiguous(), table, case.seq_lens.contiguous(),
                self.logits, self.peaks, table.shape[1], case.max_model_len, case.k_pool.shape[0],
                chunk, triton.cdiv(case.max_model_len, chunk))

    def _constants(self, tiles: int) -> dict[str, object]:
        case, config, shape = self.case, self.config, _Shape.of(self.case)
        return dict(
            NEXT_N=case.next_n, H=case.heads, D=case.head_dim, BS=case.block_size,
            NEXT_N_PAD=shape.next_n_pad, H_PAD=shape.h_pad, D_PAD=shape.d_pad, NF=shape.nf,
            BLOCK_P=config.block_p, TMA=config.uses_tma(case), FNUZ=case.fp8 == Fp8Flavour.E4M3FNUZ,
            FIX_NAN=self.interpret, NUM_STAGES=config.num_stages, IDS=_ids_width(tiles, self.interpret),
            num_warps=config.num_warps,
            **({"maxnreg": config.maxnreg} if config.maxnreg and not self.interpret else {}))


# (device index, the kernel's constants) -> programs of it the GPU runs at once
_RESIDENT: dict[tuple[int, tuple[tuple[str, object], ...]], int] = {}


def _ids_width(tiles: int, interpret: bool) -> int:
    """Block ids a program holds: its tiles, padded to a power of two; compiled, at least the default's
    most (32), so the default chunks share one compiled kernel."""
    return triton.next_power_of_2(tiles if interpret else max(tiles, MAX_DEFAULT_CHUNK_TILES))


def _pool_sources(case: Case, block_p: int, tma: bool) -> tuple[object, object]:
    """Keys and scales as the kernel reads them: tensor descriptors of the flat pool, or the tensors."""
    slots = case.k_pool.shape[0] * case.block_size
    # Tile coordinates and positions are int32 in the kernel; byte offsets are int64.
    if slots >= 2 ** 31 or case.max_model_len >= 2 ** 31 - block_p:
        raise ValueError(f"pool of {slots} slots or max_model_len {case.max_model_len} needs int64 coordinates")
    keys, scales = case.k_pool.contiguous(), case.scale_pool.contiguous()
    if not tma:
        return keys, scales
    return (TensorDescriptor.from_tensor(keys.view(slots, case.head_dim), [block_p, case.head_dim]),
            TensorDescriptor.from_tensor(scales.view(slots), [block_p]))
