"""The fused Triton oracle (difftest/oracles/fused.py) against the float64 oracle, row by row.

CPU tests run the kernel under the Triton interpreter on small cases (H 2..32, D 16..64, plus a few
at the indexer's H 64, D 128); @pytest.mark.gpu tests compile it and check it natively at the
indexer's shape, up to a 128K context. Every check is the oracle's contract: the -inf pattern of
the float64 oracle exactly, no NaN, every finite difference inside the row's bound (which must
also hold a correct fp32 evaluation), and bit-equality where every sum is exact (integer values).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from difftest.core.case import Case
from difftest.core.kinds import Fp8Flavour
from difftest.generators import CaseSpec, LengthDist, Stale, Values, build_case, edge_cases
from difftest.generators.strategies import cases
from difftest.oracles.fused import (
    U_FP32,
    FusedReference,
    KernelConfig,
    LaunchPlan,
    _wave_tiles,
    bound_gamma,
    compiled_offline,
    fused_reference,
    gamma,
    launch_plan,
)
from difftest.oracles.paged_mqa_logits import fp32_error_bound, reference
from tests.support import TINY_SPECS, golden_params

NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"
SMALL = dict(heads=8, head_dim=32)  # edge specs at a size the interpreter runs in ~0.1 s


# --------------------------------------------------------------------------- the check itself

def check(case: Case, fused: FusedReference | None = None, exact: torch.Tensor | None = None,
          what: str = "") -> float:
    """Assert the oracle's contract on `case`; return the worst |fused - float64| / bound (<= 1)."""
    fused = fused if fused is not None else fused_reference(case)
    exact = exact if exact is not None else reference(case)
    what = what or case.describe()
    logits, bound = fused.logits, fused.bound
    assert logits.dtype == torch.float32 and tuple(logits.shape) == (case.rows, case.max_model_len), what
    assert bound.dtype == torch.float32 and tuple(bound.shape) == (case.rows,), what
    assert bool((torch.isfinite(bound) & (bound >= 0)).all()), f"{what}: bound {bound.tolist()[:8]}"
    neg = torch.isneginf(logits) != torch.isneginf(exact)
    assert not neg.any(), f"{what}: -inf pattern differs at (row, pos) {torch.nonzero(neg)[:4].tolist()}"
    nan = torch.isnan(logits) != torch.isnan(exact)
    assert not nan.any(), f"{what}: NaN pattern differs at {torch.nonzero(nan)[:4].tolist()}"
    finite = torch.isfinite(exact)
    err = torch.where(finite, (logits.double() - exact).abs(), 0.0).amax(dim=1)
    over = torch.nonzero(err > bound.double()).flatten().tolist()
    assert not over, f"{what}: rows {over[:4]} err={err[over[:4]].tolist()} > bound={bound[over[:4]].tolist()}"
    lit = bound > 0
    return float((err[lit] / bound[lit].double()).max()) if lit.any() else 0.0


def check_fp32_backend(case: Case, fused: FusedReference) -> float:
    """A correct fp32 evaluation (torch, float32) stays within the bound of the fused logits; returns
    the worst |fp32 - fused| / bound."""
    single = reference(case, dtype=torch.float32)
    finite = torch.isfinite(single)
    diff = torch.where(finite, (single.double() - fused.logits.double()).abs(), 0.0).amax(dim=1)
    over = torch.nonzero(diff > fused.bound.double()).flatten().tolist()
    assert not over, f"{case.describe()}: fp32 torch rows {over[:4]} differ by {diff[over[:4]].tolist()}"
    lit = fused.bound > 0
    return float((diff[lit] / fused.bound[lit].double()).max()) if lit.any() else 0.0


def assert_bit_equal(case: Case, fused: FusedReference) -> None:
    """Integer-exact cases: every sum is exact in float32, so the logits are the float64 ones, bit for bit."""
    exact = reference(case).float()
    same = (fused.logits == exact) | (torch.isneginf(fused.logits) & torch.isneginf(exact))
    assert bool(same.all()), f"{case.describe()}: first difference at {torch.nonzero(~same)[:4].tolist()}"


# --------------------------------------------------------------------------- CPU: many small cases

@pytest.mark.parametrize("spec", TINY_SPECS, ids=lambda s: s.name)
def test_tiny_specs_within_bound(spec: CaseSpec) -> None:
    """H 2, D 16: zero-length and length-1 requests, block sizes 1, 3, 4 and 20, both flavours."""
    for seed in range(8):
        case = build_case(spec, seed)
        fused = fused_reference(case)
        check(case, fused, what=f"{spec.name} {seed=}")
        check_fp32_backend(case, fused)


@pytest.mark.parametrize("spec", edge_cases(), ids=lambda s: s.name)
def test_edge_cases_within_bound(spec: CaseSpec) -> None:
    if spec.name != "deepseek-heads":  # keep the indexer's own H 64, D 128 there
        spec = spec.replace(**SMALL)
    for flavour in Fp8Flavour:
        case = build_case(spec.replace(fp8=flavour), 7)
        fused = fused_reference(case)
        check(case, fused)
        check_fp32_backend(case, fused)
        if spec.values == Values.INTEGER:
            assert_bit_equal(case, fused)


@settings(max_examples=50)
@given(cases(max_batch=4, heads=(4, 8, 16), head_dims=(32, 64), block_sizes=(16, 1, 64), max_model_len=96))
def test_random_cases_within_bound(case: Case) -> None:
    """next_n 1..4, block sizes 1/16/64, heavy/integer/normal values, both flavours, any table."""
    fused = fused_reference(case)
    check(case, fused)
    if case.meta["spec"]["values"] == Values.INTEGER.value:
        assert_bit_equal(case, fused)


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_integer_values_bit_equal(next_n: int, block_size: int) -> None:
    spec = CaseSpec(name="integer", batch=3, next_n=next_n, heads=16, head_dim=32, block_size=block_size,
                    max_model_len=130, length_dist=LengthDist.EDGES, values=Values.INTEGER)
    case = build_case(spec, next_n * 100 + block_size)
    assert_bit_equal(case, fused_reference(case))


@pytest.mark.parametrize("flavour", list(Fp8Flavour), ids=lambda f: f.value)
def test_heavy_tailed_values_in_every_tile_path(flavour: Fp8Flavour) -> None:
    """Whole-tile copies (block_p divides the block) and per-position gathers, chunked or not, agree."""
    spec = CaseSpec(name="heavy", batch=3, next_n=2, heads=16, head_dim=64, block_size=16, max_model_len=100,
                    length_dist=LengthDist.EDGES, values=Values.HEAVY, fp8=flavour, extra_columns=1)
    case = build_case(spec, 3)
    exact = reference(case)
    configs = [KernelConfig(block_p=16, num_warps=4, num_stages=1, chunk_tiles=1),
               KernelConfig(block_p=16, num_warps=4, num_stages=1, chunk_tiles=3, tma=False),
               KernelConfig(block_p=32, num_warps=4, num_stages=1, chunk_tiles=2),
               KernelConfig(block_p=128, num_warps=4, num_stages=1)]
    assert configs[0].uses_tma(case) and not configs[1].uses_tma(case) and not configs[2].uses_tma(case)
    results = [fused_reference(case, config) for config in configs]
    for config, fused in zip(configs, results, strict=True):
        check(case, fused, exact, what=f"{config}")
    # Tiles of one size, chunked or copied differently, compute the same products: the same bits.
    assert torch.equal(results[1].logits, results[0].logits) and torch.equal(results[1].bound, results[0].bound)
    # Interpreted, a product is numpy's float32 matmul, whose BLAS may order a row's sum by the tile's size
    # (OpenBLAS's AVX-512 kernels do): the bound may move in its last bits, by no more than a reordered sum
    # of D non-negative terms can.
    drift = 2 * gamma(case.head_dim, U_FP32) * results[0].bound
    for config, fused in zip(configs[2:], results[2:], strict=True):
        assert bool(((fused.bound - results[0].bound).abs() <= drift).all()), f"{config}: {fused.bound=}"


def test_whole_tiles_read_canaries_past_the_end_harmlessly() -> None:
    """With block_p = block_size a tile straddling L reads the NaN slots after it; none may leak."""
    spec = CaseSpec(name="straddle", lengths=(5, 17, 31, 0), next_n=3, heads=4, head_dim=32, block_size=16,
                    max_model_len=64, stale=Stale.CANARY, extra_columns=2, canary_blocks=3)
    case = build_case(spec, 0)
    assert torch.isnan(case.scale_pool).any(), "the case has no canary to read"
    config = KernelConfig(block_p=16, num_warps=4, num_stages=1)
    assert config.uses_tma(case)
    check(case, fused_reference(case, config))


GPU_PARAM = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                            reason=NO_GPU)])


@pytest.mark.parametrize("device", ["cpu", GPU_PARAM])
def test_nan_inside_the_window_stays_nan(device: str) -> None:
    """A NaN key byte a row can see makes that logit NaN, as in the float64 oracle (nothing hides it)."""
    case = build_case(CaseSpec(name="nan", lengths=(20, 9), next_n=2, heads=4, head_dim=32, block_size=16,
                               max_model_len=32), 1, device=device)
    k_pool = case.k_pool.clone()
    block = int(case.block_table[0, 0])
    k_pool[block, 3, 5] = case.fp8.nan_byte
    poisoned = dataclasses.replace(case, k_pool=k_pool)
    fused = fused_reference(poisoned)
    assert torch.isnan(fused.logits[0:2, 3]).all(), f"{fused.logits[0:2, 3]=}"
    check(poisoned, fused)


def test_a_row_is_the_same_alone_and_in_a_batch() -> None:
    """Shrink-free: one sequence cut out of a batch (same pool) gets bit-identical logits and bound."""
    spec = CaseSpec(name="batch", lengths=(70, 0, 33, 128, 5), next_n=2, heads=8, head_dim=32, block_size=16,
                    max_model_len=128, values=Values.HEAVY, stale=Stale.OTHER)
    case = build_case(spec, 11)
    whole = fused_reference(case, KernelConfig(block_p=32, num_warps=4, num_stages=1, chunk_tiles=1))
    for b in range(case.batch):
        alone = dataclasses.replace(case, q=case.q[b:b + 1], weights=case.weights[2 * b:2 * b + 2],
                                    block_table=case.block_table[b:b + 1], seq_lens=case.seq_lens[b:b + 1])
        one = fused_reference(alone.validate(), KernelConfig(block_p=32, num_warps=4, num_stages=1))
        rows = slice(2 * b, 2 * b + 2)
        assert torch.equal(one.logits, whole.logits[rows]), f"sequence {b}: logits differ"
        assert torch.equal(one.bound, whole.bound[rows]), f"sequence {b}: bound differs"


def test_bound_covers_an_fp32_backend_and_is_not_vacuous() -> None:
    """The bound is zero on empty rows, at most ~5x the plain fp32 bound, and well under the row scale."""
    spec = CaseSpec(name="bound", lengths=(0, 1, 40, 96), next_n=2, heads=16, head_dim=64, block_size=16,
                    max_model_len=96)
    case = build_case(spec, 5)
    fused = fused_reference(case)
    check_fp32_backend(case, fused)
    plain = fp32_error_bound(case.q_values(), case.k_values(), case.scale_pool, case.weights, case.block_table,
                             case.row_lens())
    limits = case.row_lens().flatten()
    assert torch.equal(fused.bound[limits == 0], torch.zeros_like(fused.bound[limits == 0])), f"{fused.bound=}"
    ratio = fused.bound.double()[limits > 0] / plain.double()[limits > 0]
    assert bool(((ratio >= 1) & (ratio < 5)).all()), f"fused bound / fp32 bound = {ratio.tolist()}"
    scale = reference(case).nan_to_num(neginf=0.0).abs().amax(dim=1)
    assert bool((fused.bound[limits > 0].double() < 1e-3 * scale[limits > 0]).all()), f"{fused.bound=} {scale=}"
    assert bound_gamma(64, 128) < 5 * 195 * 2.0 ** -24, "gamma at H 64, D 128"


@pytest.mark.parametrize("path", golden_params())
def test_golden_files(path) -> None:
    case = Case.load(path)
    with np.load(path) as z:
        expected = torch.from_numpy(z["expected"].copy())
        name = json.loads(str(z["meta"]))["name"]
    check(case, fused_reference(case), expected, what=name)


# --------------------------------------------------------------------------- GPU: the indexer's shape

def on_gpu(test):
    """@pytest.mark.gpu, and skipped with the reason where torch sees no GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)(test))


def _indexer_spec(**changes: object) -> CaseSpec:
    return CaseSpec(name="indexer", heads=64, head_dim=128, block_size=64).replace(**changes)


# next_n 1, 2, 4 with every value family; e4m3fnuz at two of them.
INDEXER_RUNS = [(n, v, Fp8Flavour.E4M3FN) for n in (1, 2, 4) for v in Values] + [
    (2, Values.HEAVY, Fp8Flavour.E4M3FNUZ), (4, Values.INTEGER, Fp8Flavour.E4M3FNUZ)]


@pytest.mark.parametrize("next_n,values,flavour", INDEXER_RUNS,
                         ids=lambda x: x.value if isinstance(x, (Values, Fp8Flavour)) else str(x))
@on_gpu
def test_gpu_indexer_shape(next_n: int, values: Values, flavour: Fp8Flavour) -> None:
    spec = _indexer_spec(next_n=next_n, batch=6, max_model_len=3000, length_dist=LengthDist.EDGES,
                         values=values, fp8=flavour, padding=1, extra_columns=1)
    case = build_case(spec, next_n, device="cuda")
    fused = fused_reference(case)
    margin = check(case, fused)
    single = check_fp32_backend(case, fused)
    if values == Values.INTEGER:
        assert_bit_equal(case, fused)
    print(f"{case.describe()} {values.value}: worst |fused-fp64|/bound {margin:.3g}, "
          f"|torch fp32-fused|/bound {single:.3g}")


@pytest.mark.parametrize("next_n", [1, 2, 4])
@on_gpu
def test_gpu_128k_context(next_n: int) -> None:
    spec = _indexer_spec(next_n=next_n, lengths=(131072, 131072 - 77, 1, 0), max_model_len=131072 + 64)
    case = build_case(spec, 1, device="cuda")
    fused = fused_reference(case)
    margin = check(case, fused)
    single = check_fp32_backend(case, fused)
    print(f"{case.describe()}: worst |fused-fp64|/bound {margin:.3g}, |torch fp32-fused|/bound {single:.3g}")


@pytest.mark.parametrize("spec", edge_cases(), ids=lambda s: s.name)
@on_gpu
def test_gpu_edge_cases(spec: CaseSpec) -> None:
    for block_size in (64, 1):  # whole-tile copies, then gathers
        case = build_case(spec.replace(heads=64, head_dim=128, block_size=block_size, max_model_len=256), 3,
                          device="cuda")
        fused = fused_reference(case)
        check(case, fused)
        if spec.values == Values.INTEGER:
            assert_bit_equal(case, fused)


@pytest.mark.parametrize("path", golden_params())
@on_gpu
def test_gpu_golden_files(path) -> None:
    case = Case.load(path).to("cuda")
    with np.load(path) as z:
        expected = torch.from_numpy(z["expected"].copy()).cuda()
    check(case, fused_reference(case), expected)


@on_gpu
def test_gpu_matches_interpreter() -> None:
    """Compiled and interpreted kernels agree within the bound; on integer values, bit for bit."""
    for values in (Values.HEAVY, Values.INTEGER):
        spec = _indexer_spec(next_n=2, batch=3, max_model_len=200, length_dist=LengthDist.EDGES, values=values)
        case = build_case(spec, 2)
        cpu, gpu = fused_reference(case), fused_reference(case.to("cuda"))
        diff = (gpu.logits.cpu().double() - cpu.logits.double()).nan_to_num(0.0).abs().amax(dim=1)
        assert bool((diff <= cpu.bound.double()).all()), f"{values}: {diff.tolist()} vs {cpu.bound.tolist()}"
        if values == Values.INTEGER:
            assert torch.equal(gpu.logits.cpu(), cpu.logits)


@pytest.mark.parametrize("batch,next_n,context", [(64, 1, 8192), (16, 4, 32768)])
@on_gpu
def test_gpu_peak_memory_under_half_the_logits(batch: int, next_n: int, context: int) -> None:
    spec = _indexer_spec(next_n=next_n, lengths=(context,) * batch, max_model_len=context)
    case = build_case(spec, 0, device="cuda")
    fused_reference(case)  # compile first: Triton's own first-launch allocations are not the oracle's
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fused = fused_reference(case)
    torch.cuda.synchronize()
    logits_bytes = fused.logits.numel() * 4
    extra = torch.cuda.max_memory_allocated() - before - logits_bytes
    assert extra < 0.5 * logits_bytes, f"extra {extra} bytes vs logits {logits_bytes}"



@pytest.mark.parametrize(("tiles_per_row", "sequences", "slots", "tiles"), [
    # B 40 at a 122,880 context on 132 SMs x 3: 32 tiles a program would make 6.06 waves, 28 make 6.97
    (1920, 40, 396, 28),
    # B 40 at 120,000 (the bench's shape): 32 tiles make 5.96 waves, already whole
    (1875, 40, 396, 32),
    # B 16, 32K on 132 SMs x 2: one wave of 256 programs beats two of 512
    (512, 16, 264, 32),
    # one short sequence: as many one-tile programs as it has tiles, all in the first wave
    (128, 1, 396, 1),
    # more programs than the GPU holds whatever the chunk: the longest chunk, the fewest prologues
    (10_000, 1000, 16, 32),
])
def test_programs_fill_whole_waves(tiles_per_row: int, sequences: int, slots: int, tiles: int) -> None:
    assert _wave_tiles(tiles_per_row, sequences, slots) == tiles


def test_an_interpreted_launch_takes_the_whole_row() -> None:
    case = build_case(CaseSpec(name="row", lengths=(300,), max_model_len=300, block_size=16), 0)
    # 300 keys in the interpreter's tiles of 256 (few, wide programs)
    assert launch_plan(case) == LaunchPlan(tiles=2, at_once=None)


def test_the_kernel_compiles_for_hopper_without_a_gpu_onto_its_tensor_cores() -> None:
    """compiled_offline: Triton's compiler and ptxas build the sm90 kernel here, whatever the machine has, and
    both products are Hopper warpgroup MMAs (what scripts/fused_kernel_report.py reads registers from)."""
    case = build_case(_indexer_spec(next_n=2, batch=2, max_model_len=256), 0)
    compiled = compiled_offline(case)
    assert compiled.asm["cubin"] and compiled.metadata.shared > 0
    assert compiled.asm["ttgir"].count("ttng.warp_group_dot ") == 2, "the scores' product and the bound's"
