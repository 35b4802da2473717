"""DeepGEMM's backends: their declared contracts and CPU skips everywhere; on an sm90 GPU with
DeepGEMM importable, the native and flattened paths against the oracle and against each other, the
next_n = 4 schedule, and the zero-length-request finding
(docs/findings/deepgemm-zero-length-request.md) reproduced on the pinned 2.8.1."""

from __future__ import annotations

import ast
import dataclasses
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import difftest
from difftest.backends import deep_gemm, load_backend
from difftest.backends.deep_gemm import VARIANTS, DeepGemm, describe, load_deep_gemm
from difftest.core import hardware
from difftest.core.contract import WorkPartition
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention, PartitionScope
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case
from difftest.generators.cases import suite
from difftest.oracles.reference import make_reference

ENCODINGS = {"deepgemm": LengthEncoding.PER_ROW, "deepgemm-flattened": LengthEncoding.FLATTENED,
             "deepgemm-varlen": LengthEncoding.FLATTENED_INDICES, "deepgemm-bf16-logits": LengthEncoding.PER_ROW}
MODULE, HOW = load_deep_gemm()
ON_SM90 = torch.cuda.is_available() and MODULE is not None and hardware.arch() == "sm90"
NOT_SM90 = ("needs an sm90 GPU with DeepGEMM importable: "
            + (hardware.CUDA_UNAVAILABLE if not torch.cuda.is_available()
               else f"DeepGEMM not importable ({HOW})" if MODULE is None else f"this GPU is {hardware.arch()}"))
needs_sm90 = pytest.mark.skipif(not ON_SM90, reason=NOT_SM90)
SPLIT_KV = 256  # tokens per schedule split of the sm90 kernel (DeepGEMM's host code)


@pytest.mark.parametrize("name", ENCODINGS)
def test_contract_declares_what_the_library_takes(name):
    backend = load_backend(name).backend
    contract = backend.contract
    assert isinstance(backend, DeepGemm) and backend.name == name and backend.variant is VARIANTS[name]
    assert contract.length_encoding == ENCODINGS[name] and contract.cache_layout == CacheLayout.BLOCK_SPLIT
    assert contract.mask == MaskConvention.TAIL_UNSPECIFIED, "DeepGEMM leaves the tail past each limit as it is"
    assert contract.devices == ("cuda",) and contract.head_dims == (32, 64, 128)
    assert contract.rtol == 1e-2, "FP8 MMA accumulation: 3.0e-3 of the row scale seen on the H200"
    assert contract.max_context == 262144, "measured on the H200"


def test_the_sm90_variants_declare_the_kernels_schedule():
    """256-token splits of 64-token tiles over the SMs, half of them at next_n = 4 (native only: the
    flattened kernel always sees next_n = 1)."""
    native, flattened = load_backend("deepgemm").contract, load_backend("deepgemm-flattened").contract
    for contract in (native, flattened):
        assert contract.archs == ("sm90",) and contract.block_sizes == (32, 64) and contract.heads == (32, 64)
        assert contract.tiles == (64, 256) and contract.output_dtype == torch.float32
    assert native.next_n == (1, 2, 4) and flattened.next_n is None
    assert native.partition == WorkPartition(256, PartitionScope.GLOBAL, None, halved_at_next_n=(4,))
    assert flattened.partition == WorkPartition(256, PartitionScope.GLOBAL, None)
    assert native.partition.worker_count(4, 132) == 66 and flattened.partition.worker_count(4, 132) == 132


def test_bf16_logits_is_the_native_envelope_storing_bf16():
    native, bf16 = load_backend("deepgemm").contract, load_backend("deepgemm-bf16-logits").contract
    assert bf16 == dataclasses.replace(native, output_dtype=torch.bfloat16)


def test_varlen_declares_sm100_and_leaves_unknown_facts_unknown():
    contract = load_backend("deepgemm-varlen").contract
    assert contract.archs == ("sm100", "sm103") and contract.block_sizes == (32, 64, 128)
    assert contract.output_dtype == torch.bfloat16 and contract.next_n is None
    assert (contract.heads, contract.tiles, contract.partition) == (None, (), None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given where torch sees no GPU")
@pytest.mark.parametrize("name", ENCODINGS)
def test_every_variant_skips_on_the_cpu_with_its_reason(name):
    backend = DeepGemm(name)
    assert backend.unavailable_reason("cpu") == "DeepGEMM runs on CUDA GPUs only (device cpu)"
    assert backend.unavailable_reason("cuda") == hardware.CUDA_UNAVAILABLE
    result = run([backend], [build_case(CaseSpec(batch=2, next_n=2, block_size=64, max_model_len=128), 0)],
                 RunConfig())[0]
    assert result.verdict == Verdict.SKIP and result.reason == "DeepGEMM runs on CUDA GPUs only (device cpu)"


def test_the_library_is_looked_up_under_both_names_and_why_it_is_missing_is_kept():
    if MODULE is not None:
        assert HOW.startswith(("deep_gemm ", "vllm.third_party.deep_gemm ")), HOW
        assert HOW.endswith(f" ({Path(MODULE.__file__).parent})"), HOW
    else:
        assert "deep_gemm:" in HOW and "vllm.third_party.deep_gemm:" in HOW, HOW


def test_the_library_names_the_folder_a_module_was_imported_from():
    """Trees of one version differ in where they are (vllm 0.30.0's and 0.31.0's DeepGEMM are both 2.8.0)."""
    assert describe("torch", torch) == f"torch {torch.__version__} ({Path(torch.__file__).parent})"


# --------------------------------------------------------------------------- on an sm90 GPU

@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_native_and_flattened_pass_the_edges(next_n):
    """The edge list at the indexer's shape (H 64, D 128, block 64); sm90 has no native next_n = 3."""
    pairs = suite("edges", next_n=(next_n,), block_sizes=(64,), heads=64, head_dim=128)
    cases = [build_case(spec, seed, "cuda", name=spec.name) for spec, seed in pairs]
    results = run([DeepGemm("deepgemm"), DeepGemm("deepgemm-flattened")], cases,
                  RunConfig(device="cuda", isolate=False))
    expected = {"deepgemm": Verdict.SKIP if next_n == 3 else Verdict.PASS, "deepgemm-flattened": Verdict.PASS}
    wrong = [(r.backend, r.case, r.verdict.value, r.reason) for r in results if r.verdict != expected[r.backend]]
    assert not wrong, wrong


@pytest.mark.gpu
@needs_sm90
def test_next_n_4_needs_the_schedule_for_half_the_sms():
    """sm90 runs two query atoms per SM at next_n = 4: the kernel refuses a schedule for every SM."""
    backend = DeepGemm("deepgemm")
    inputs = encode(build_case(CaseSpec(batch=4, next_n=4, block_size=64, max_model_len=512), 0, "cuda"),
                    backend.contract)
    assert backend.num_sms(MODULE, 4) == MODULE.get_num_sms() // 2
    full = MODULE.get_paged_mqa_logits_metadata(inputs.context_lens, 64, MODULE.get_num_sms())
    with pytest.raises(RuntimeError, match="schedule_meta_size"):
        backend.launch(inputs, full)
    backend.launch(inputs, backend.schedule(inputs))


def straddling_case(flatten_q_of: int | None = None):
    """[S, 0, 1] with S = (num_sms - 1) * SPLIT_KV + 1 tokens: num_sms + 1 splits, so the last SM's two
    splits span the empty request. With `flatten_q_of` = 1, request 2 gets request 1's q and weights."""
    first = (MODULE.get_num_sms() - 1) * SPLIT_KV + 1
    spec = CaseSpec(batch=3, next_n=1, heads=64, head_dim=128, block_size=64, max_model_len=first,
                    lengths=(first, 0, 1))
    case = build_case(spec, 0, "cuda", name="zero-length-straddle")
    if flatten_q_of is None:
        return case
    q, weights = case.q.clone(), case.weights.clone()
    q[2], weights[2] = q[flatten_q_of], weights[flatten_q_of]
    return dataclasses.replace(case, q=q, weights=weights)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.skipif(ON_SM90 and getattr(MODULE, "__version__", "") != "2.8.1",
                    reason=f"the finding is pinned to DeepGEMM 2.8.1 (vllm 0.33.0); this is {HOW}")
@pytest.mark.parametrize("name", ["deepgemm", "deepgemm-flattened"])
def test_the_request_after_an_empty_one_gets_its_q(name):
    """docs/findings/deepgemm-zero-length-request.md: request 2 is scored with request 1's q and
    weights (request 1 has no keys); its window and keys are its own."""
    backend = DeepGemm(name)
    case = straddling_case()
    result = run([backend], [case], RunConfig(device="cuda", isolate=False))[0]
    assert result.verdict == Verdict.FAIL_VALUE and result.comparison.value_rows == [2], result
    got = backend(encode(case, backend.contract), None)[2, :1].double()
    borrowed = make_reference(straddling_case(flatten_q_of=1)).logits[2, :1]
    own = make_reference(case).logits[2, :1]
    assert torch.allclose(got, borrowed, rtol=1e-2), f"{got=} {borrowed=} {own=}"
    assert not torch.allclose(got, own, rtol=1e-2)


# --------------------------------------------------------------------------- the call's binding, on the CPU

# get_paged_mqa_logits_metadata is the torch op itself in both vendored builds (_C.py `_bind_guarded_ops`),
# with the schema the .so registers: "get_paged_mqa_logits_metadata(Tensor context_lens, int block_kv,
# int num_sms, Tensor? indices=None) -> Tensor" (the same string in vllm 0.33.0's and 0.34.0's builds).
METADATA_PARAMETERS = "context_lens, block_kv, num_sms, indices=None"


def signature_of(source: str, name: str) -> str:
    """The parameters of the function `name` defines in `source`, as written there."""
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(node.args)


def bound_arguments(parameters: str) -> Callable[..., dict]:
    """A function with these parameters that returns how a call bound its arguments: a fake of the
    signature alone, so that how the adapter calls is checked, not what the library computes."""
    namespace = {"torch": torch}
    exec(f"def bound({parameters}):\n    return dict(locals())", namespace)
    return namespace["bound"]


@pytest.fixture
def vendored_api(field_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], types.SimpleNamespace]:
    """deep_gemm as the backend sees it, with each vendored build's Python signatures (read from the
    release wheel's _C.py, never loaded) and SM count 132."""

    def install(release: str) -> types.SimpleNamespace:
        source = (field_tree / f"deep_gemm-api-{release}" / "vllm/third_party/deep_gemm/_C.py").read_text()
        module = types.SimpleNamespace(
            fp8_fp4_paged_mqa_logits=bound_arguments(signature_of(source, "fp8_fp4_paged_mqa_logits")),
            get_paged_mqa_logits_metadata=bound_arguments(METADATA_PARAMETERS), get_num_sms=lambda: 132)
        monkeypatch.setattr(deep_gemm, "loaded_module", lambda: module)
        return module

    return install


@pytest.mark.parametrize("release", ["vllm-0.33.0", "vllm-0.34.0"])
def test_varlen_passes_indices_by_keyword_to_both_calls_whatever_stands_before_it(vendored_api, release):
    """0.34.0's entry point takes logits_dtype before indices: a positional indices would land there."""
    vendored_api(release)
    backend = DeepGemm("deepgemm-varlen")
    inputs = encode(build_case(CaseSpec(batch=3, next_n=2, block_size=64, max_model_len=128), 0), backend.contract)
    metadata = backend.schedule(inputs)
    assert metadata["indices"] is inputs.indices and metadata["num_sms"] == 132
    logits = backend.launch(inputs, metadata)
    assert logits["indices"] is inputs.indices and logits["schedule_meta"] is metadata
    assert logits.get("logits_dtype", torch.float32) == torch.float32


def test_bf16_logits_needs_the_entry_point_that_takes_logits_dtype(vendored_api):
    backend = DeepGemm("deepgemm-bf16-logits")
    old = vendored_api("vllm-0.33.0")
    assert backend.signature_reason(old) == \
        f"bound of {deep_gemm.library_name()} takes no logits_dtype"
    vendored_api("vllm-0.34.0")
    inputs = encode(build_case(CaseSpec(batch=2, next_n=2, block_size=64, max_model_len=128), 0), backend.contract)
    assert backend.signature_reason(deep_gemm.loaded_module()) is None
    logits = backend.launch(inputs, backend.schedule(inputs))
    assert (logits["logits_dtype"], logits["indices"]) == (torch.bfloat16, None)


def test_the_row_padded_view_deepgemm_returns_is_read_through_its_strides():
    """DeepGEMM returns `[:, :max_context_len]` of rows padded to 256 columns; what lies between a row's
    end and the next row's start (garbage, in DeepGEMM) must not be read as the next row."""
    case = build_case(CaseSpec(batch=3, next_n=2, heads=32, block_size=64, max_model_len=100), 0)
    expected = make_reference(case).logits.float()
    padded = torch.full((case.rows, 256), float("nan"))
    padded[:, :100] = expected
    contract = dataclasses.replace(load_backend("deepgemm").contract, devices=("cpu",), archs=None)
    view = padded[:, :100]
    assert view.stride(0) == 256
    result = difftest.check(difftest.backend(contract, name="row-padded-view")(lambda *args: view), case)
    assert result.verdict == Verdict.PASS
