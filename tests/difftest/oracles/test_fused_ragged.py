"""The fused ragged Triton oracle (difftest/oracles/fused_ragged.py) against the float64 oracle, row by row.

CPU tests run the kernel under the Triton interpreter on toy cases (every edge family of the small plan, the
golden files, each tile path); @pytest.mark.gpu tests compile it and check it at the indexer's shape. The
check is the oracle's contract: the float64 oracle's -inf and NaN patterns exactly, every finite difference
inside the row's bound (which must also hold a correct fp32 evaluation), and bit-equality where every sum is
exact (integer values).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.ragged import RaggedCase, RaggedContract, RaggedTiles
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, RaggedSpec, RaggedWindows, build_ragged_case, ragged_plan
from difftest.generators.spec import Values
from difftest.oracles.fused import FusedReference
from difftest.oracles.fused_ragged import RaggedKernelConfig, fused_ragged_reference
from difftest.oracles.ragged_mqa_logits import error_bound, ragged_mqa_logits, reference

NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False"
GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden" / "ragged").glob("*.npz"))
# A window-relative contract with DeepGEMM's tiles and q blocks, any heads: its small plan is every family.
CONTRACT = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_UNSPECIFIED,
                          tiles=RaggedTiles(kv=(64, 256), q_head_rows=128, start_align=4))


def check(case: RaggedCase, fused: FusedReference | None = None, what: str = "") -> None:
    """Assert the oracle's contract on `case`."""
    fused = fused if fused is not None else fused_ragged_reference(case)
    exact = reference(case)
    what = what or case.describe()
    logits, bound = fused.logits, fused.bound
    assert logits.dtype == torch.float32 and tuple(logits.shape) == tuple(exact.shape), what
    assert bool((torch.isfinite(bound) & (bound >= 0)).all()), f"{what}: bound {bound.tolist()[:8]}"
    assert torch.equal(torch.isneginf(logits), torch.isneginf(exact)), f"{what}: -inf pattern differs"
    assert torch.equal(torch.isnan(logits), torch.isnan(exact)), f"{what}: NaN pattern differs"
    finite = torch.isfinite(exact)
    err = torch.where(finite, (logits.double() - exact).abs(), 0.0).amax(dim=1)
    assert bool((err <= bound.double()).all()), f"{what}: {err.tolist()} over {bound.tolist()}"
    single = ragged_mqa_logits(case.q_values(torch.float32), case.k.view(case.fp8.dtype), case.k_scale,
                               case.weights, case.k_start, case.k_end, case.seqlen_k).double()
    fp32_err = torch.where(finite, (single - exact).abs(), 0.0).amax(dim=1)
    assert bool((fp32_err <= bound.double()).all()), f"{what}: a float32 evaluation leaves the bound"
    assert bool((bound.double() >= error_bound(case)).all()), f"{what}: below the float64 oracle's fp32 bound"


def _small_plan() -> list[RaggedSpec]:
    return [p.spec for p in ragged_plan(CONTRACT, Target.small_cpu()) if isinstance(p, RaggedPlanned)]


@pytest.mark.parametrize("spec", _small_plan(), ids=lambda s: s.name)
def test_every_family_of_the_small_plan(spec):
    check(build_ragged_case(spec, 0))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_cases(path):
    check(RaggedCase.load(path))


def test_integer_values_bit_equal():
    spec = RaggedSpec(rows=9, keys=140, heads=8, head_dim=32, windows=RaggedWindows.STAIRCASE, requests=3,
                      values=Values.INTEGER)
    case = build_ragged_case(spec, 5)
    fused, exact = fused_ragged_reference(case), reference(case)
    assert torch.equal(fused.logits, exact.float()), "every sum is exact: the float32 logits equal the float64 ones"


def test_every_tile_path_agrees():
    """Descriptor copies or masked loads, one program per block or chunks of one tile, one row or eight per
    block: the same -inf pattern, every value inside the bound."""
    case = build_ragged_case(RaggedSpec(rows=7, keys=200, heads=4, head_dim=32, values=Values.HEAVY), 3)
    configs = [RaggedKernelConfig(block_m=1, block_n=16, num_warps=4, num_stages=1, chunk_tiles=1, tma=True),
               RaggedKernelConfig(block_m=2, block_n=32, num_warps=4, num_stages=1, chunk_tiles=2, tma=False),
               RaggedKernelConfig(block_m=8, block_n=64, num_warps=4, num_stages=1)]
    for config in configs:
        check(case, fused_ragged_reference(case, config=config), what=str(config))


def test_head_dim_off_a_power_of_two_takes_the_masked_loads():
    case = build_ragged_case(RaggedSpec(rows=3, keys=70, heads=3, head_dim=48), 0)
    assert not RaggedKernelConfig(block_m=1, block_n=16, num_warps=4, num_stages=1).uses_tma(case)
    check(case)


def test_empty_windows_only_and_a_width_past_the_windows():
    empty = build_ragged_case(RaggedSpec(rows=3, keys=10, heads=2, head_dim=16, starts=(0, 4, 10),
                                         ends=(0, 4, 10)), 0)
    fused = fused_ragged_reference(empty)
    assert torch.isneginf(fused.logits).all() and not bool(fused.bound.any())
    wide = build_ragged_case(RaggedSpec(rows=3, keys=30, heads=2, head_dim=16, max_seqlen_k=45), 1)
    check(wide)


def test_nan_inside_a_window_stays_nan():
    case = build_ragged_case(RaggedSpec(rows=2, keys=20, heads=2, head_dim=16, starts=(0, 5), ends=(10, 20)), 0)
    k = case.k.clone()
    k[7, 3] = 0x7F
    broken = RaggedCase(case.name, case.q, k, case.k_scale, case.weights, case.k_start, case.k_end)
    fused = fused_ragged_reference(broken)
    assert torch.isnan(fused.logits[0, 7]) and torch.isnan(fused.logits[1, 2])
    assert torch.isfinite(fused.logits[0, :7]).all() and torch.isfinite(fused.logits[1, 3:15]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("spec", [
    RaggedSpec(name="staircase", rows=1024, keys=16384, heads=64, head_dim=128, windows=RaggedWindows.STAIRCASE,
               requests=3),
    RaggedSpec(name="random", rows=333, keys=9000, heads=32, head_dim=64),
    RaggedSpec(name="heavy", rows=64, keys=3000, heads=64, head_dim=128, values=Values.HEAVY),
], ids=lambda s: s.name)
def test_compiled_on_a_gpu(spec):
    case = build_ragged_case(spec, 0, device="cuda")
    check(case)
