"""DeepGEMM's backends: their declared contracts and CPU skips everywhere; on an sm90 GPU with
DeepGEMM importable, the native and flattened paths against the oracle and against each other, the
next_n = 4 schedule, and the zero-length-request finding
(docs/findings/deepgemm-zero-length-request.md) reproduced on the pinned 2.8.1."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from difftest.backends import load_backend
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
             "deepgemm-varlen": LengthEncoding.FLATTENED_INDICES}
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
