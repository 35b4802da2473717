"""AITER's Triton paged MQA logits kernels under the Triton interpreter, against the oracle.

The kernels disagree with the oracle (docs/findings/aiter-triton-mask.md), so these tests pin the
disagreement down instead of hiding it:

* `replay_kernel` re-enacts, in plain torch, every store the kernel makes (its row window
  p <= L - j, the zero it computes at p == L, its unbounded CHUNK_K-wide stores) in the order
  the interpreter runs its programs. The kernel must match that replay exactly, everywhere.
* The smallest cases of each disagreement are asserted position by position against the oracle.

If AITER fixes any of the three, the replay tests fail and point here.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from difftest.backends import load_backend
from difftest.core.case import Case
from difftest.core.kernel_inputs import encode, token_table
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention
from difftest.oracles.paged_mqa_logits import reference
from tests.support import golden_params

pytest.importorskip("triton", reason="triton is not installed: the AITER kernels are Triton kernels")

from difftest.backends import aiter_triton

# The backends' own reason: amd-aiter missing, kernel file missing, or a kernel with other arguments.
_UNAVAILABLE = aiter_triton.AiterTriton("aiter-triton-fused").unavailable_reason("cpu")
if _UNAVAILABLE:
    pytest.skip(_UNAVAILABLE, allow_module_level=True)

NAMES = ("aiter-triton-stage1", "aiter-triton-fused", "aiter-triton-stage1-ragged", "aiter-triton-fused-ragged")
CHUNK_K, SPLIT_KV = aiter_triton.CHUNK_K, aiter_triton.SPLIT_KV
REPLAY_RTOL = 1e-5  # the interpreter's tl.dot is a float32 numpy matmul of exact fp8 products


def backend(name: str) -> aiter_triton.AiterTriton:
    made = load_backend(name).backend
    assert isinstance(made, aiter_triton.AiterTriton), f"{name}: {type(made)=}"
    return made


def run(name: str, case: Case) -> tuple[torch.Tensor, int]:
    """(logits, floats stored past the buffer's end) of one backend on `case`, on the case's device."""
    kernel = backend(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", aiter_triton.OutOfBoundsWrite)
        got = kernel(encode(case, kernel.contract), None)
    return got, kernel.last_out_of_bounds


# --------------------------------------------------------------------------- cases

def positive_case(lengths: list[int], next_n: int, heads: int, max_model_len: int, head_dim: int = 32,
                  seed: int = 0) -> Case:
    """Block size 1, token p of sequence b in slot 1 + offset_b + p; every logit inside a window > 0.

    q, keys and weights are positive and the scales are 1, so a logit is never 0: a 0.0 in the
    output is a value the kernel invented. Slot 0 is a spare token no sequence uses.
    """
    gen = torch.Generator().manual_seed(seed)
    slots = 1 + sum(lengths)

    def fp8(*shape: int) -> torch.Tensor:
        return (0.25 + torch.rand(shape, generator=gen)).to(torch.float8_e4m3fn).view(torch.uint8)

    width = max(1, *lengths)
    table = torch.zeros((len(lengths), width), dtype=torch.int32)
    start = 1
    for b, length in enumerate(lengths):
        table[b, :length] = torch.arange(start, start + length, dtype=torch.int32)
        start += length
    return Case(name=f"positive-L{lengths}-n{next_n}-H{heads}-mml{max_model_len}",
                q=fp8(len(lengths), next_n, heads, head_dim), k_pool=fp8(slots, 1, head_dim),
                scale_pool=torch.ones((slots, 1)),
                weights=0.5 + torch.rand((len(lengths) * next_n, heads), generator=gen),
                block_table=table, seq_lens=torch.tensor(lengths), max_model_len=max_model_len,
                fp8=Fp8Flavour.E4M3FN).validate()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- the kernel, replayed

def head_scores(case: Case, width: int) -> torch.Tensor:
    """float64 [H, rows, width]: w[r, h] * relu(q[b, j, h] . k_p * s_p), each head as the kernel has it.

    At p >= L_b the kernel's key load is masked to 0 but its scale load is not: the masked token-id
    load yields id 0, so the scale is token slot 0's (0 * a NaN scale there would be NaN).
    """
    tokens = token_table(case).long()  # [B, W * block_size]
    tokens = torch.nn.functional.pad(tokens, (0, max(0, width - tokens.shape[1])))[:, :width]
    inside = torch.arange(width)[None, :] < case.seq_lens[:, None]  # [B, width]
    slot = torch.where(inside, tokens, 0)
    keys = torch.where(inside[..., None], case.k_values().reshape(-1, case.head_dim)[slot], 0.0)
    dots = torch.einsum("bjhd,bpd->hbjp", case.q_values(), keys)
    dots = dots * case.scale_pool.reshape(-1).double()[slot][None, :, None, :]
    w = case.weights.double().reshape(case.batch, case.next_n, case.heads).permute(2, 0, 1)  # [H, B, next_n]
    return (torch.relu(dots) * w[..., None]).reshape(case.heads, case.rows, width)


def replay_kernel(case: Case, per_head: bool) -> tuple[torch.Tensor, int]:
    """(logits, floats stored past the end): every store of the kernel, in the interpreter's order.

    Program pid = head_block + blocks * (j + next_n * (b + B * split)) runs to completion before
    pid + 1. It walks its share of row r's CHUNK_K-wide chunks, keeps p <= L - j (where the oracle
    keeps p <= L - next_n + j) and stores all CHUNK_K positions at r * max_model_len + p, unbounded.
    """
    heads, rows, width = case.heads, case.rows, case.max_model_len
    chunk_q = aiter_triton.STAGE1_CHUNK_Q if per_head else heads
    blocks, planes = heads // chunk_q, heads if per_head else 1
    scores = head_scores(case, cdiv(width, CHUNK_K) * CHUNK_K + CHUNK_K)
    end = planes * rows * width
    flat = torch.full((end + CHUNK_K,), math.nan, dtype=torch.float64)  # NaN guard, as the backend's
    flat[:end] = -math.inf
    for pid in range(rows * blocks * SPLIT_KV):
        rest, block = divmod(pid, blocks)
        rest, j = divmod(rest, case.next_n)
        split, b = divmod(rest, case.batch)
        row, length = b * case.next_n + j, int(case.seq_lens[b])
        share = cdiv(cdiv(length, CHUNK_K), SPLIT_KV) * CHUNK_K
        first = split * share
        for start in range(first, first + min(length - first, share), CHUNK_K):
            p = torch.arange(start, start + CHUNK_K)
            heads_here = scores[block * chunk_q:(block + 1) * chunk_q, row, start:start + CHUNK_K]
            values = torch.where(p <= length - j, heads_here, -math.inf)  # [chunk_q, CHUNK_K]
            if not per_head:
                flat[row * width + p] = values.sum(dim=0)
            for h in range(chunk_q) if per_head else ():  # one head after another: later stores win
                flat[((block * chunk_q + h) * rows + row) * width + p] = values[h]
    return flat[:end].reshape(planes, rows, width).sum(dim=0), int((~torch.isnan(flat[end:])).sum())


def oracle_window(case: Case) -> torch.Tensor:
    """The oracle's finite positions, [rows, max_model_len]."""
    return torch.isfinite(reference(case))


def assert_matches_replay(got: torch.Tensor, replay: torch.Tensor, what: str) -> None:
    """Identical -inf and NaN patterns; finite values within REPLAY_RTOL of each row's largest."""
    got = got.double()
    for pattern in (torch.isneginf, torch.isnan):
        diff = torch.nonzero(pattern(got) != pattern(replay))
        assert not len(diff), (f"{what}: {pattern.__name__} differs at {diff[:6].tolist()}; "
                               f"got={[got[r, p].item() for r, p in diff[:6].tolist()]}, "
                               f"replay={[replay[r, p].item() for r, p in diff[:6].tolist()]}")
    finite = torch.isfinite(replay)
    scale = torch.where(finite, replay.abs(), 0.0).amax(dim=1, keepdim=True).clamp(min=1e-30)
    rel = torch.where(finite, (got - replay).abs() / scale, 0.0)
    worst = torch.nonzero(rel == rel.max())[0].tolist()
    assert float(rel.max()) <= REPLAY_RTOL, f"{what}: max relative error {float(rel.max()):.3g} at {worst}"


# --------------------------------------------------------------------------- registry, contract, availability

def test_all_four_registered_with_honest_contracts():
    version = aiter_triton.aiter_version()
    for name in NAMES:
        kernel = backend(name)
        c = kernel.contract
        assert kernel.name == name
        ragged, per_head = "ragged" in name, "stage1" in name
        assert c.length_encoding == (LengthEncoding.PREFIX_SUM if ragged else LengthEncoding.PER_SEQUENCE), name
        assert (c.cache_layout, c.mask, c.fp8, c.output_dtype) == (
            CacheLayout.TOKEN_INTERLEAVED, MaskConvention.TAIL_NEG_INF, Fp8Flavour.E4M3FN, torch.float32), name
        assert c.block_sizes == (1,) and not c.writes_into_output, name
        assert c.heads_multiple_of == (32 if per_head else 1), f"{name}: {c.heads_multiple_of=}"
        assert c.library == f"amd-aiter {version} ({aiter_triton.kernel_file()})", f"{name}: {c.library=}"


def test_version_without_distribution_metadata(monkeypatch):
    """A bare package tree (no dist-info, as copied to the GPU machine) still names its version."""
    installed = aiter_triton.aiter_version()

    def missing(name: str) -> str:
        raise aiter_triton.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(aiter_triton.importlib.metadata, "version", missing)
    assert aiter_triton.aiter_version() == installed


def test_a_tree_first_on_the_path_names_its_own_version_not_the_installed_one(tmp_path, monkeypatch):
    """A source checkout put first on sys.path (docs/versions.md) shadows the installed amd-aiter: the
    version and the kernel file named are the checkout's, though the installed metadata says otherwise."""
    kernel = tmp_path / "aiter" / aiter_triton.KERNEL_FILES[1]
    kernel.parent.mkdir(parents=True)
    kernel.touch()  # an empty file at the path: only where it is matters here
    (tmp_path / "aiter/__init__.py").touch()
    (tmp_path / "aiter/_version.py").write_text("__version__ = 'v0.1.20-46-ge4048607a5'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert aiter_triton.aiter_version() == "v0.1.20-46-ge4048607a5"
    assert aiter_triton.kernel_file() == kernel


@pytest.mark.parametrize("name", NAMES)
def test_available_on_cpu(name):
    assert backend(name).unavailable_reason("cpu") is None


def test_unavailable_reasons_name_the_cause(monkeypatch):
    kernel = backend("aiter-triton-fused")
    assert "neither 'cpu'" in kernel.unavailable_reason("tpu")
    if not torch.cuda.is_available():
        assert kernel.unavailable_reason("cuda") == "torch.cuda.is_available() is False"
    monkeypatch.setattr(aiter_triton, "KERNEL_FILES", ("ops/triton/nowhere.py", "ops/nowhere/either.py"))
    assert kernel.unavailable_reason("cpu").startswith("neither ops/triton/nowhere.py nor ops/nowhere/either.py")
    monkeypatch.setattr(aiter_triton.importlib.util, "find_spec", lambda name: None)
    assert kernel.unavailable_reason("cpu") == "amd-aiter is not installed (importlib.util.find_spec('aiter') is None)"


def test_a_kernel_with_other_arguments_is_refused(monkeypatch):
    kernel = backend("aiter-triton-fused")
    variant = aiter_triton.KernelVariant("_deepgemm_fp8_paged_mqa_logits_ragged_k", ragged=False, per_head=False,
                                         slowdown=1.5)
    monkeypatch.setattr(kernel, "variant", variant)
    assert "neither the amd-aiter 0.1.7 arguments" in kernel.unavailable_reason("cpu")
    monkeypatch.setattr(kernel, "variant", dataclasses.replace(variant, kernel="_no_such_kernel"))
    assert kernel.unavailable_reason("cpu").endswith("defines no _no_such_kernel")


def test_fused_skips_heads_that_are_not_a_power_of_two():
    from difftest.engine.runner import unsupported_reason

    case = positive_case([3], next_n=1, heads=24, max_model_len=64)
    assert unsupported_reason(backend("aiter-triton-fused"), case, "cpu") == "heads=24 is not a power of two"
    assert unsupported_reason(backend("aiter-triton-stage1"), case, "cpu") == "heads=24 is not a multiple of 32"


def test_interpreted_runs_leave_triton_as_they_found_it(monkeypatch):
    """No TRITON_INTERPRET left set, and triton.language's builtins unpatched, so a GPU compile
    later in the same process still works (an interpreted device-function call patches them)."""
    import triton.language as tl

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    objects = (tl.core, tl.math, tl.core.tensor, tl.core.dtype)
    before = [dict(vars(obj)) for obj in objects]
    run("aiter-triton-fused", positive_case([2], next_n=1, heads=8, max_model_len=64))
    assert "TRITON_INTERPRET" not in aiter_triton.os.environ
    for obj, old in zip(objects, before, strict=True):
        now = vars(obj)
        changed = sorted(name for name in set(old) | set(now) if now.get(name) is not old.get(name))
        assert not changed, f"{obj}: {changed[:8]}"


# --------------------------------------------------------------------------- the kernel is its replay

# Golden cases whose H and D the backend accepts. The fused kernels at H = 64 take ~5 s under the
# interpreter (tl.reduce with a Python combine function), so they run on H <= 16 cases only.
GOLDEN_FUSED = [p for p in golden_params() if p.values[0] is None or p.id not in ("mtp4_heads64_d128",
                                                                                  "e4m3fnuz_flavour")]
GOLDEN_STAGE1 = [p for p in golden_params() if p.values[0] is None or p.id == "mtp4_heads64_d128"]


@pytest.mark.parametrize("name", ["aiter-triton-fused", "aiter-triton-fused-ragged"])
@pytest.mark.parametrize("path", GOLDEN_FUSED)
def test_fused_kernels_match_their_replay_on_golden(name, path):
    case = Case.load(path)
    got, spilled = run(name, case)
    replay, replay_spilled = replay_kernel(case, per_head=False)
    assert_matches_replay(got, replay, f"{name} on {case.name}")
    assert spilled == replay_spilled, f"{name} on {case.name}: {spilled=} {replay_spilled=}"


@pytest.mark.parametrize("name", ["aiter-triton-stage1", "aiter-triton-stage1-ragged"])
@pytest.mark.parametrize("path", GOLDEN_STAGE1)
def test_stage1_kernels_match_their_replay_on_golden(name, path):
    case = Case.load(path)
    got, spilled = run(name, case)
    replay, replay_spilled = replay_kernel(case, per_head=True)
    assert_matches_replay(got, replay, f"{name} on {case.name}")
    assert spilled == replay_spilled == 0, f"{name} on {case.name}: {spilled=} {replay_spilled=}"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("lengths,next_n,max_model_len", [
    ([0, 1, 2, 63, 64, 65], 1, 128),  # padding, tiny, chunk edges; no spill (128 = 2 chunks)
    ([3, 5, 66], 3, 70),  # rows with 2 chunks whose last chunk spills into the next row
    ([1, 130], 2, 130),  # L = max_model_len: the zero at p == L lands on the next row's position 0
])
def test_kernels_match_their_replay(name, lengths, next_n, max_model_len):
    # Stage1 takes heads in blocks of 32; the fused kernels' tl.reduce over H is slow interpreted.
    case = positive_case(lengths, next_n, heads=32 if "stage1" in name else 8, max_model_len=max_model_len)
    got, spilled = run(name, case)
    replay, replay_spilled = replay_kernel(case, per_head="stage1" in name)
    assert_matches_replay(got, replay, f"{name} on {case.name}")
    assert spilled == replay_spilled, f"{name} on {case.name}: {spilled=} {replay_spilled=}"


@pytest.mark.parametrize("stage", ["stage1", "fused"])
def test_ragged_kernels_give_the_same_bits(stage):
    case = positive_case([5, 70, 0, 2], next_n=2, heads=32 if stage == "stage1" else 8, max_model_len=128, seed=3)
    plain, _ = run(f"aiter-triton-{stage}", case)
    ragged, _ = run(f"aiter-triton-{stage}-ragged", case)
    assert torch.equal(plain, ragged), f"{stage}: {torch.nonzero(plain != ragged)[:4].tolist()}"


def window_disagrees(length: int, j: int, next_n: int, max_model_len: int) -> bool:
    """The analysis, in closed form: does row j's kernel window differ from the oracle's?

    Kernel: p <= L - j inside the stored chunks (so p == L only for j == 0, as a 0.0, when L is
    not a multiple of CHUNK_K and still inside the row). Oracle: p <= L - next_n + j.
    """
    if length == 0:
        return False
    kernel_last = min(length - j, -(-length // CHUNK_K) * CHUNK_K - 1, max_model_len - 1)
    oracle_last = length - next_n + j
    return max(kernel_last, -1) != max(oracle_last, -1)


def test_mismatch_rows_are_exactly_the_window_analysis():
    """With no spilling store (max_model_len a multiple of CHUNK_K), the rows whose -inf pattern
    disagrees with the oracle are exactly the rows the closed-form analysis predicts."""
    lengths, next_n = [0, 1, 2, 3, 64, 65, 128], 4
    case = positive_case(lengths, next_n=next_n, heads=32, max_model_len=128, seed=1)
    got, spilled = run("aiter-triton-stage1", case)
    observed = torch.nonzero((torch.isfinite(got) != oracle_window(case)).any(dim=1)).flatten().tolist()
    predicted = [b * next_n + j for b, length in enumerate(lengths) for j in range(next_n)
                 if window_disagrees(length, j, next_n, case.max_model_len)]
    assert spilled == 0
    assert observed == predicted, f"{observed=} {predicted=}"
    # Only j = next_n / 2 agrees; j = 0 of L = 64 and 128 disagrees without the zero at p = L
    # (no stored chunk holds p = L): the kernel's window is [0, L), the oracle's [0, L - 3).
    assert [r % next_n for r in predicted].count(2) == 0 and {4 * 4, 6 * 4} <= set(predicted)


# --------------------------------------------------------------------------- the smallest disagreements

def finite_positions(logits: torch.Tensor, row: int) -> list[int]:
    return torch.nonzero(torch.isfinite(logits[row])).flatten().tolist()


@pytest.mark.parametrize("name", ["aiter-triton-stage1", "aiter-triton-fused"])
def test_finding_next_n_1_writes_zero_at_p_equal_L(name):
    """B=1, next_n=1, L=1, max_model_len=64: position 1 holds 0.0 where the oracle has -inf."""
    case = positive_case([1], next_n=1, heads=32, max_model_len=64)
    got, spilled = run(name, case)
    assert finite_positions(reference(case), 0) == [0]
    assert finite_positions(got, 0) == [0, 1], f"{finite_positions(got, 0)=}"
    assert got[0, 1].item() == 0.0 and got[0, 0].item() > 0 and spilled == 0


@pytest.mark.parametrize("name", ["aiter-triton-stage1", "aiter-triton-fused"])
def test_finding_mtp_window_is_mirrored(name):
    """B=1, next_n=3, L=3: row j sees p <= L - j, the oracle p <= L - next_n + j.

    Row 0 also sees the future keys 1 and 2 and a 0.0 at p=3; row 1 the future key 2; row 2 loses
    its own key 2 (-inf where the oracle has a value).
    """
    case = positive_case([3], next_n=3, heads=32, max_model_len=64)
    got, _ = run(name, case)
    expected = reference(case)
    assert [finite_positions(expected, r) for r in range(3)] == [[0], [0, 1], [0, 1, 2]]
    assert [finite_positions(got, r) for r in range(3)] == [[0, 1, 2, 3], [0, 1, 2], [0, 1]]
    assert got[0, 3].item() == 0.0 and got[0, 1].item() > 0 and got[0, 2].item() > 0  # future keys 1, 2
    assert torch.allclose(got[2, :2].double(), expected[2, :2], rtol=1e-6)  # what row 2 keeps is right
    assert torch.isneginf(got[2, 2]) and expected[2, 2].item() > 0


def test_finding_fused_store_spills_into_the_next_row():
    """B=2, next_n=1, L=[65, 1], max_model_len=65 (not a multiple of 64): row 0's second chunk
    (positions 64..127, stored by split 1 after row 1's split 0) lands on row 1 positions 0..62.
    Row 1's only logit becomes 0.0 (the zero computed at p = L0 = 65)."""
    case = positive_case([65, 1], next_n=1, heads=8, max_model_len=65)
    got, spilled = run("aiter-triton-fused", case)
    expected = reference(case)
    assert expected[1, 0].item() > 0 and finite_positions(expected, 1) == [0]
    assert got[1, 0].item() == 0.0 and finite_positions(got, 1) == [0]
    assert torch.equal(torch.isfinite(got[0]), torch.isfinite(expected[0])) and spilled == 0


def test_finding_stage1_store_spills_across_heads_and_past_the_end():
    """B=2, next_n=1, H=32, L=[40, 40], max_model_len=48: row 1's 64-wide store runs 16 positions
    past each head's row, onto row 0 of the next head (-inf there) and, for the last head, 16
    floats past the end of the [H, rows, 48] buffer. Row 0's logits 0..15 come out -inf."""
    case = positive_case([40, 40], next_n=1, heads=32, max_model_len=48)
    kernel = backend("aiter-triton-stage1")
    with pytest.warns(aiter_triton.OutOfBoundsWrite, match="stored 16 float32 values past the end"):
        got = kernel(encode(case, kernel.contract), None)
    expected = reference(case)
    assert kernel.last_out_of_bounds == 16
    assert finite_positions(expected, 0) == list(range(40))
    assert finite_positions(got, 0) == list(range(16, 41)), f"{finite_positions(got, 0)=}"


# --------------------------------------------------------------------------- compiled, on a GPU

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.is_available() is False")
@pytest.mark.parametrize("name", NAMES)
def test_compiled_kernel_has_the_interpreters_window(name):
    """Without spilling stores (max_model_len a multiple of CHUNK_K) the GPU build of the kernel
    shows the interpreter's -inf pattern, findings 1 and 2 included; values within the contract."""
    case = positive_case([0, 1, 3, 64, 65, 128], next_n=3, heads=32 if "stage1" in name else 8, max_model_len=128)
    cpu, _ = run(name, case)
    gpu, spilled = run(name, case.to("cuda"))
    gpu = gpu.cpu()
    assert spilled == 0
    differ = torch.nonzero(torch.isneginf(gpu) != torch.isneginf(cpu))
    assert not len(differ), f"-inf pattern differs at {differ[:4].tolist()}"
    finite = torch.isfinite(cpu)
    scale = torch.where(finite, cpu.abs(), 0.0).amax(dim=1, keepdim=True).clamp(min=1e-30)
    rel = torch.where(finite, (gpu - cpu).abs() / scale, 0.0)
    assert float(rel.max()) <= backend(name).contract.rtol, f"{float(rel.max())=}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.is_available() is False")
@pytest.mark.parametrize("name", NAMES)
def test_the_declared_working_memory_is_what_a_call_allocates_besides_its_logits(name):
    """What the planner and the runner count (Contract.working_memory) against what a call takes from the
    GPU besides the logits it returns: stage1's per-head buffer (and the guard past it), next to nothing
    for the fused kernels, which fill the buffer they return."""
    kernel = backend(name)
    inputs = encode(positive_case([0, 1, 200, 1000], next_n=2, heads=64, max_model_len=1024).to("cuda"),
                    kernel.contract)
    kernel(inputs, None)  # the first launch compiles: what Triton allocates then is not the call's
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    logits = kernel(inputs, None)
    torch.cuda.synchronize()
    besides = torch.cuda.max_memory_allocated() - before - logits.numel() * logits.element_size()
    declared = kernel.contract.working_memory.bytes_for(logits.numel(), 64)
    assert declared <= besides <= declared + (1 << 20), f"{name}: {besides=} {declared=}"


def test_aiter_verdicts_reach_the_cli_report(tmp_path, capsys):
    """`difftest run` drives the interpreted kernels end to end: their verdicts land in the table and the
    JSON report, each row the mirrored window predicts counted as a wrong -inf mask."""
    import json

    from difftest.cli import main

    report = tmp_path / "report.json"
    spec = '{"name":"mtp2","next_n":2,"max_model_len":64,"lengths":[17,5]}'
    code = main(["run", "--backends", "torch,aiter-triton-stage1", "--spec", spec, "--seed", "3",
                 "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 1, out
    doc = json.loads(report.read_text())
    verdicts = {r["backend"]: r["verdict"] for r in doc["results"]}
    assert verdicts == {"torch": "PASS", "aiter-triton-stage1": "FAIL(mask)"}, f"{verdicts=}"
    aiter = next(r for r in doc["results"] if r["backend"] == "aiter-triton-stage1")
    # next_n = 2: row j = 0 of each sequence sees one future key (p <= L - 0), row 1 is right.
    assert aiter["comparison"]["mask_rows"] == [0, 2], f"{aiter['comparison']=}"
    assert "aiter-triton-stage1" in out and "2/4" in out, out
