"""vLLM's backends (the optional `vllm` extra).

Without vllm (CI): every one of them skips with the import error as its reason.
With vllm importable (a venv holding the vllm 0.33.0 wheel, CPU): fp8_paged_mqa_logits_torch against
the oracle over the edges and random cases, next_n 1-4, and its finding pinned down: at next_n = 1 it
reads the block-split cache vLLM writes, at next_n > 1 it reads the same bytes as token-interleaved
(keys at token * (D + 4), the scale right after them) and applies the scale before the ReLU, so
every MTP case with block_size > 1 comes out wrong. The Triton decode kernel and the DeepGEMM
wrapper need a GPU; here only their contracts and reasons are checked.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from difftest.backends import load_backend
from difftest.backends import vllm_indexer as vi
from difftest.core.case import Case
from difftest.core.kernel_inputs import KernelInputs, decode_row_lens, encode
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.layout import unpack_cache
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case
from difftest.generators.cases import suite
from difftest.oracles.paged_mqa_logits import paged_mqa_logits

NAMES = ("vllm-torch-ref", "vllm-triton-decode", "vllm-deepgemm")
VLLM_MISSING = importlib.util.find_spec("vllm") is None
NO_VLLM_REASON = "vllm not importable: ModuleNotFoundError: No module named 'vllm'"
OPS_REASON = vi.load(vi.OPS)[1]
needs_vllm = pytest.mark.skipif(OPS_REASON is not None, reason=f"needs vllm importable: {OPS_REASON}")


def backend(name: str):
    made = load_backend(name)
    assert made.name == name, f"{name=} made {made.name=}"
    return made


def cases(kind: str, next_n: int, **overrides: object) -> list[Case]:
    """The `kind` suite at one next_n: the edges, or two seeds of each random spec."""
    return [build_case(spec, seed, name=spec.name) for spec, seed in suite(kind, count=2, next_n=(next_n,),
                                                                            **overrides)]


def verdicts(results: list[CaseResult]) -> dict[str, str]:
    return {r.case: r.verdict.value for r in results}


# --------------------------------------------------------------------------- anywhere

def test_contracts_declare_what_vllms_indexer_passes():
    """(B, next_n) lengths ((B, 1) at next_n = 1) and block-split bytes, as the metadata builder makes them."""
    contracts = {name: backend(name).contract for name in NAMES}
    assert {c.length_encoding for c in contracts.values()} == {LengthEncoding.PER_ROW}
    assert {c.cache_layout for c in contracts.values()} == {CacheLayout.BLOCK_SPLIT}
    ref, triton, deep_gemm = contracts.values()
    assert (ref.mask, ref.devices, ref.rtol) == (MaskConvention.TAIL_NEG_INF, ("cpu", "cuda"), 1e-5)
    assert (triton.mask, triton.devices, triton.block_sizes) == (MaskConvention.TAIL_UNSPECIFIED, ("cuda",),
                                                                 (64, 128, 256))
    assert triton.writes_into_output, "the workspace it writes is poisoned first"
    assert (deep_gemm.archs, deep_gemm.next_n) == (("sm90",), (1, 2, 4))


def plant_vllm(root: Path, version: str, whole: bool = True) -> Path:
    """A folder holding a vllm package (empty files: only where it is and its _version.py matter), or,
    without `whole`, a carried kernel copy (no vllm/__init__.py)."""
    package = root / "vllm"
    package.mkdir(parents=True)
    (package / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    if whole:
        (package / "__init__.py").touch()
    return root


def test_the_library_names_the_vllm_package_imported_and_its_own_version(tmp_path, monkeypatch):
    """A checkout first on sys.path shadows an installed vllm: its folder and its _version.py are named."""
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    checkout = plant_vllm(tmp_path / "checkout", "0.34.1.dev7+g1234abc")
    installed = plant_vllm(tmp_path / "site", "0.33.0")
    monkeypatch.setattr(sys, "path", [str(checkout), str(installed), *sys.path])
    assert vi.vllm_package() == checkout / "vllm"
    assert vi.vllm_library("fp8_paged_mqa_logits_torch") == \
        f"vllm 0.34.1.dev7+g1234abc (fp8_paged_mqa_logits_torch from {checkout / 'vllm'})"


def test_a_carried_kernel_copy_is_no_vllm_package(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "path", [str(plant_vllm(tmp_path / "carried", "0.33.0", whole=False)), *sys.path])
    if VLLM_MISSING:
        assert vi.vllm_package() is None
        assert vi.vllm_library("fp8_paged_mqa_logits_torch") == "vllm (not installed; fp8_paged_mqa_logits_torch)"
    else:  # an installed vllm later on the path is the one imported
        assert vi.vllm_package() != tmp_path / "carried" / "vllm"


@pytest.mark.skipif(not VLLM_MISSING, reason="checks the reasons given where vllm is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_without_vllm_every_backend_skips_with_the_import_error(name):
    made = backend(name)
    # The Triton decode kernel and the torch reference would also run from a copy of their file
    # (vllm_triton_decode, vllm_torch_ref): none here.
    why = NO_VLLM_REASON + (f"; and no sys.path entry holds a copy of {vi.vllm_triton_decode.FILE}"
                            if name in ("vllm-triton-decode", "vllm-torch-ref") else "")
    assert made.unavailable_reason("cpu") == why
    assert made.unavailable_reason("cuda") == why
    assert made.contract.library.startswith("vllm (not installed"), made.contract.library
    result = run([made], [build_case(CaseSpec(batch=2, next_n=2, block_size=64, max_model_len=128), 0)],
                 RunConfig())[0]
    assert (result.verdict, result.reason) == (Verdict.SKIP, why)


# --------------------------------------------------------------------------- with vllm importable

@needs_vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given where torch sees no GPU")
def test_the_gpu_backends_say_why_they_cannot_run_here():
    assert backend("vllm-torch-ref").unavailable_reason("cpu") is None
    assert backend("vllm-triton-decode").unavailable_reason("cpu") == \
        "vLLM's Triton decode kernel runs on GPUs only (device cpu)"
    assert backend("vllm-deepgemm").unavailable_reason("cpu") == "DeepGEMM runs on GPUs only (device cpu)"
    for name in NAMES:
        assert backend(name).unavailable_reason("cuda") == "torch.cuda.is_available() is False"


@needs_vllm
@pytest.mark.parametrize("kind", ["edges", "random"])
def test_at_next_n_1_it_agrees_with_the_oracle(kind):
    results = run([backend("vllm-torch-ref")], cases(kind, 1), RunConfig(isolate=False))
    wrong = {case: v for case, v in verdicts(results).items() if v != "PASS"}
    assert not wrong, wrong


@needs_vllm
@pytest.mark.parametrize("next_n", [2, 3, 4])
@pytest.mark.parametrize("kind", ["edges", "random"])
def test_at_mtp_it_reads_the_cache_token_interleaved(kind, next_n):
    """Block-split bytes (what vLLM writes): every case with a visible token in a block of size > 1
    fails; the same case handed token-interleaved bytes (--layout what-if) passes."""
    ref, suite_cases = backend("vllm-torch-ref"), cases(kind, next_n)
    declared = run([ref], suite_cases, RunConfig(isolate=False))
    misread = {c.name for c in suite_cases if c.block_size > 1 and int(c.row_lens().max()) > 0}
    assert misread, "the suite has cases the finding applies to"
    assert {r.case for r in declared if r.verdict.failed} == misread, verdicts(declared)
    interleaved = run([ref], suite_cases, RunConfig(isolate=False, layout=CacheLayout.TOKEN_INTERLEAVED))
    assert {r.verdict for r in interleaved} == {Verdict.PASS}, verdicts(interleaved)


def misread_replay(inputs: KernelInputs) -> torch.Tensor:
    """What the next_n > 1 branch computes from the bytes it is handed: each token's D key bytes and
    its scale taken as token-interleaved, and the scale applied to the key before the ReLU."""
    batch, next_n, _, head_dim = inputs.q.shape
    keys, scales = unpack_cache(inputs.kv_cache, head_dim, CacheLayout.TOKEN_INTERLEAVED)
    scaled_keys = keys.view(inputs.fp8.dtype).float() * scales[..., None]
    return paged_mqa_logits(inputs.q.float(), scaled_keys, torch.ones_like(scales), inputs.weights,
                            inputs.block_table, decode_row_lens(inputs, batch, next_n), inputs.max_model_len)


@needs_vllm
@pytest.mark.parametrize("next_n", [2, 3, 4])
def test_at_mtp_its_output_is_exactly_the_token_interleaved_reading(next_n):
    ref = backend("vllm-torch-ref")
    for case in cases("edges", next_n):
        inputs = encode(case, ref.contract)
        got, replay = ref(inputs, None), misread_replay(inputs)
        assert torch.equal(torch.isnan(got), torch.isnan(replay)), case.name
        assert torch.equal(torch.isinf(got) & (got < 0), torch.isinf(replay) & (replay < 0)), case.name
        finite = torch.isfinite(got) & torch.isfinite(replay)
        scale = replay.where(finite, 0.0).abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
        err = ((got - replay).abs() / scale).where(finite, 0.0).max().item()
        assert err < 1e-5, f"{case.name}: {err=}"


@needs_vllm
def test_the_smallest_case():
    """One sequence of one token, next_n = 2, block size 2: row 1 sees token 0, whose scale the
    reference takes from the first 4 key bytes of slot 1, a NaN canary (no token lives there)."""
    spec = CaseSpec(name="smallest", lengths=(1,), next_n=2, heads=1, head_dim=16, block_size=2,
                    max_model_len=2, canary_blocks=1)
    case = build_case(spec.validate(), 0, name="smallest")
    (result,) = run([backend("vllm-torch-ref")], [case], RunConfig(isolate=False))
    assert result.verdict == Verdict.FAIL_NAN, result
    first = result.comparison.first_mismatch
    assert (first.row, first.position) == (1, 0) and first.got != first.got, first
    (interleaved,) = run([backend("vllm-torch-ref")], [case],
                         RunConfig(isolate=False, layout=CacheLayout.TOKEN_INTERLEAVED))
    assert interleaved.verdict == Verdict.PASS, interleaved


@needs_vllm
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_block_size_1_passes_at_every_next_n(next_n):
    """With one token per block the two layouts are the same bytes: the finding needs block_size > 1."""
    results = run([backend("vllm-torch-ref")], cases("all", next_n, block_sizes=(1,)), RunConfig(isolate=False))
    assert {r.verdict for r in results} == {Verdict.PASS}, verdicts(results)


@needs_vllm
def test_one_length_per_sequence_reads_the_same_as_the_per_row_table():
    """Its docstring also allows (B,) lengths; the branch that derives the rows agrees with the table."""
    ref = backend("vllm-torch-ref")
    for case in cases("edges", 3):
        per_row = encode(case, ref.contract)
        per_sequence = encode(case, ref.contract, encoding=LengthEncoding.PER_SEQUENCE)
        torch.testing.assert_close(ref(per_sequence, None), ref(per_row, None), rtol=0, atol=0, equal_nan=True,
                                   msg=case.name)
