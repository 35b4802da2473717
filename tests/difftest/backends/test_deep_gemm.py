"""DeepGEMM's backends: their declared contracts and CPU skips everywhere; on an sm90 GPU with
DeepGEMM importable, the native and flattened paths against the oracle and against each other, the
next_n = 4 schedule, and the zero-length-request finding
(docs/findings/deepgemm-zero-length-request.md) reproduced on the pinned 2.8.1."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.backends.deep_gemm import (
    DeepGemmFlattened,
    DeepGemmNative,
    DeepGemmVarlen,
    arch,
    load_deep_gemm,
)
from difftest.encode import encode
from difftest.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.runner import RunConfig, make_reference, run
from difftest.verdict import Verdict
from generators import CaseSpec, build_case
from generators.cases import suite

VARIANTS = {"deepgemm": (DeepGemmNative, LengthEncoding.PER_ROW),
            "deepgemm-flattened": (DeepGemmFlattened, LengthEncoding.FLATTENED),
            "deepgemm-varlen": (DeepGemmVarlen, LengthEncoding.FLATTENED_INDICES)}
MODULE, HOW = load_deep_gemm()
ON_SM90 = torch.cuda.is_available() and MODULE is not None and arch() == "sm90"
NOT_SM90 = ("needs an sm90 GPU with DeepGEMM importable: "
            + ("torch.cuda.is_available() is False" if not torch.cuda.is_available()
               else f"DeepGEMM not importable ({HOW})" if MODULE is None else f"this GPU is {arch()}"))
needs_sm90 = pytest.mark.skipif(not ON_SM90, reason=NOT_SM90)
SPLIT_KV = 256  # tokens per schedule split of the sm90 kernel (DeepGEMM's host code)


@pytest.mark.parametrize("name", VARIANTS)
def test_contract_declares_what_the_library_takes(name):
    kind, encoding = VARIANTS[name]
    contract = kind().contract
    assert kind.name == name
    assert contract.length_encoding == encoding and contract.cache_layout == CacheLayout.BLOCK_SPLIT
    assert contract.mask == MaskConvention.TAIL_UNSPECIFIED, "DeepGEMM leaves the tail past each limit as it is"
    assert contract.devices == ("cuda",) and contract.block_sizes == (32, 64)
    assert contract.rtol == 1e-2, "FP8 MMA accumulation: 3.0e-3 of the row scale seen on the H200"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given where torch sees no GPU")
@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_skips_on_the_cpu_with_its_reason(name):
    backend = VARIANTS[name][0]()
    assert backend.unavailable_reason("cpu") == "DeepGEMM runs on CUDA GPUs only (device cpu)"
    assert backend.unavailable_reason("cuda") == "torch.cuda.is_available() is False"
    result = run([backend], [build_case(CaseSpec(batch=2, next_n=2, block_size=64, max_model_len=128), 0)],
                 RunConfig())[0]
    assert result.verdict == Verdict.SKIP and result.reason == "DeepGEMM runs on CUDA GPUs only (device cpu)"


def test_the_library_is_looked_up_under_both_names_and_why_it_is_missing_is_kept():
    if MODULE is not None:
        assert HOW.startswith(("deep_gemm ", "vllm.third_party.deep_gemm ")), HOW
    else:
        assert "deep_gemm:" in HOW and "vllm.third_party.deep_gemm:" in HOW, HOW


# --------------------------------------------------------------------------- on an sm90 GPU

@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_native_and_flattened_pass_the_edges(next_n):
    """The edge list at the indexer's shape (H 64, D 128, block 64); sm90 has no native next_n = 3."""
    pairs = suite("edges", next_n=(next_n,), block_sizes=(64,), heads=64, head_dim=128)
    cases = [build_case(spec, seed, "cuda", name=spec.name) for spec, seed in pairs]
    results = run([DeepGemmNative(), DeepGemmFlattened()], cases, RunConfig(device="cuda", isolate=False))
    expected = {"deepgemm": Verdict.SKIP if next_n == 3 else Verdict.PASS, "deepgemm-flattened": Verdict.PASS}
    wrong = [(r.backend, r.case, r.verdict.value, r.reason) for r in results if r.verdict != expected[r.backend]]
    assert not wrong, wrong


@pytest.mark.gpu
@needs_sm90
def test_next_n_4_needs_the_schedule_for_half_the_sms():
    """sm90 runs two query atoms per SM at next_n = 4: the kernel refuses a schedule for every SM."""
    backend = DeepGemmNative()
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
@pytest.mark.parametrize("kind", [DeepGemmNative, DeepGemmFlattened])
def test_the_request_after_an_empty_one_gets_its_q(kind):
    """docs/findings/deepgemm-zero-length-request.md: request 2 is scored with request 1's q and
    weights (request 1 has no keys); its window and keys are its own."""
    backend = kind()
    case = straddling_case()
    result = run([backend], [case], RunConfig(device="cuda", isolate=False))[0]
    assert result.verdict == Verdict.FAIL_VALUE and result.comparison.value_rows == [2], result
    got = backend(encode(case, backend.contract), None)[2, :1].double()
    borrowed = make_reference(straddling_case(flatten_q_of=1)).logits[2, :1]
    own = make_reference(case).logits[2, :1]
    assert torch.allclose(got, borrowed, rtol=1e-2), f"{got=} {borrowed=} {own=}"
    assert not torch.allclose(got, own, rtol=1e-2)
