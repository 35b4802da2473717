"""The variant tables and the envelopes the built-in backends declare (issue 11 item 1).

Each library is one class whose variants are rows of a table; every registered name resolves to a
backend built from its own row, with that row's contract. The envelope values are the libraries'
own facts (cited in the backend modules) or measurements; these tests pin them so a change is seen.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from difftest.backends import (
    aiter_rocm,
    aiter_triton,
    deep_gemm,
    flag_gems,
    flashinfer,
    load_backend,
    sglang,
    torch_ref,
    vllm_indexer,
    vllm_step5,
)
from difftest.backends.user import FunctionBackend
from difftest.core.contract import WorkingMemory, WorkPartition
from difftest.core.kinds import PartitionScope
from difftest.engine.plan import envelope_plan
from difftest.generators.envelope import EdgeFamily, Target, envelope_specs
from tests.user_backends import raises

TABLES = {aiter_triton: aiter_triton.VARIANTS, aiter_rocm: aiter_rocm.WRAPPERS, deep_gemm: deep_gemm.VARIANTS,
          vllm_indexer: vllm_indexer.PATHS, vllm_step5: vllm_step5.CALLERS, sglang: sglang.PATHS,
          flashinfer: flashinfer.VARIANTS}


@pytest.mark.parametrize("module", TABLES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_table_row_is_a_registered_name(module):
    assert set(module.BACKENDS) == set(TABLES[module])
    made = [factory() for factory in module.BACKENDS.values()]
    assert len({type(b) for b in made}) == 1, "one class per library, not one per variant"
    assert [b.name for b in made] == list(TABLES[module])


@pytest.mark.parametrize("name", list(aiter_triton.VARIANTS))
def test_aiter_triton_names_launch_their_kernel(name):
    made = load_backend(name).backend
    assert made.variant is aiter_triton.VARIANTS[name]
    assert made.contract == aiter_triton.kernel_contract(aiter_triton.VARIANTS[name])


@pytest.mark.parametrize("name", list(aiter_rocm.WRAPPERS))
def test_aiter_rocm_names_call_their_wrapper(name):
    made = load_backend(name).backend
    wrapper = aiter_rocm.WRAPPERS[name]
    assert made.wrapper is wrapper and wrapper.variant is aiter_triton.VARIANTS[name.replace("rocm", "triton")]
    assert made.contract == dataclasses.replace(aiter_triton.kernel_contract(wrapper.variant), devices=("cuda",),
                                                fp8=aiter_rocm.native_fp8())


@pytest.mark.parametrize("name", list(deep_gemm.VARIANTS))
def test_deep_gemm_names_are_their_variant(name):
    made = load_backend(name).backend
    assert made.variant is deep_gemm.VARIANTS[name]
    assert made.contract == deep_gemm.VARIANTS[name].contract(deep_gemm.library_name())
    assert made.contract.length_encoding == deep_gemm.VARIANTS[name].encoding
    assert made.contract.archs == deep_gemm.VARIANTS[name].archs


@pytest.mark.parametrize("name", list(vllm_indexer.PATHS))
def test_vllm_names_take_their_path(name):
    made = load_backend(name).backend
    assert made.path is vllm_indexer.PATHS[name] and made.contract == vllm_indexer.PATHS[name].contract()


# --------------------------------------------------------------------------- the envelopes

@pytest.mark.parametrize("name", list(aiter_triton.VARIANTS) + list(aiter_rocm.WRAPPERS))
def test_aiter_kernels_declare_chunks_and_splits_and_no_cache_bound(name):
    c = load_backend(name).contract
    assert c.tiles == (64,) and c.tiles == (aiter_triton.CHUNK_K,)
    assert c.partition == WorkPartition(64, PartitionScope.PER_ROW, workers=5)
    assert c.partition.worker_count(4, 132) == 5, "programs per row, whatever the GPU"
    # The int32 cache offsets are a bug production caches reach, not a limit the plan should avoid.
    assert c.max_pool_bytes is None and c.block_sizes == (1,) and c.head_dims == (32, 64, 128, 256)
    stage1 = "stage1" in name
    assert (c.heads_multiple_of, c.heads_power_of_two) == ((32, False) if stage1 else (1, True))
    assert (c.heads, c.next_n, c.max_context) == (None, None, None), "runtime arguments the kernels do not bound"


@pytest.mark.parametrize("name", list(aiter_triton.VARIANTS) + list(aiter_rocm.WRAPPERS))
def test_aiter_stage1_declares_the_per_head_buffer_its_caller_holds(name):
    """[H, rows, max_model_len] fp32 besides the head sum returned; the fused kernels fill the returned buffer."""
    held = WorkingMemory(bytes_per_logit_per_head=4) if "stage1" in name else WorkingMemory()
    assert load_backend(name).contract.working_memory == held


def test_no_other_backend_declares_working_memory():
    """DeepGEMM, vLLM's paths and torch return (or fill) the logits and hold nothing of that size besides."""
    others = [*deep_gemm.VARIANTS, *vllm_indexer.PATHS, *torch_ref.BACKENDS, *vllm_step5.CALLERS, "sglang-tilelang",
              *flashinfer.VARIANTS, *flag_gems.BACKENDS]
    assert {name: load_backend(name).contract.working_memory for name in others} == dict.fromkeys(
        others, WorkingMemory())


# The H200's SMs and all of its memory: more than any probe leaves a run (Target.probe keeps 85 % of what is free).
H200 = Target.production_gpu(sms=132, memory_bytes=139 << 30)
LOGITS_2_31 = {"logits-under-2^31", "logits-over-2^31"}


@pytest.mark.parametrize("name", aiter_triton.VARIANTS)
def test_on_an_h200_stage1_leaves_the_2_31_logit_cases_out_and_the_fused_kernels_keep_them(name):
    """Stage1 asked the H200 for 512 GiB on these cases and ended in an out-of-memory ERROR: its plan
    leaves them out instead, saying how much the per-head buffer needs."""
    planned, omitted = envelope_specs(load_backend(name).contract, H200)
    reached = {p.spec.name for p in planned if EdgeFamily.LOGITS_2_31_ELEMENTS in p.families}
    reasons = [o.reason for o in omitted if o.family == EdgeFamily.LOGITS_2_31_ELEMENTS]
    if "stage1" not in name:
        assert reached == LOGITS_2_31 and not reasons, f"{reached=} {reasons=}"
        return
    assert not reached and len(reasons) == 2, f"{reached=} {reasons=}"
    for reason in reasons:
        assert "GB kernel working memory" in reason and f"{H200.memory_bytes / 1e9:.1f} GB allowed" in reason, reason
        working = float(reason.split(" GB kernel working memory")[0].rsplit(" ", 1)[1]) * 1e9
        assert working > (512 << 30), f"{working=}: 4 bytes per head (64) per logit (2^31)"


def test_on_an_h200_sglangs_torch_reference_leaves_the_2_31_logit_cases_out():
    """It gathers and widens every page it reads (about 540 bytes per logit, 8 more per head): 2^31 logits
    would need terabytes. The Triton and TileLang kernels, which allocate only their output, keep them."""
    for name, reached in (("sglang-torch-ref", set()), ("sglang-tilelang", LOGITS_2_31), ("vllm-step5", LOGITS_2_31)):
        planned = envelope_specs(load_backend(name).contract, H200)[0]
        assert {p.spec.name for p in planned if EdgeFamily.LOGITS_2_31_ELEMENTS in p.families} == reached, name
    reasons = [o.reason for o in envelope_specs(load_backend("sglang-torch-ref").contract, H200)[1]
               if o.family == EdgeFamily.LOGITS_2_31_ELEMENTS]
    assert len(reasons) == 2 and all("GB kernel working memory" in reason for reason in reasons), reasons


def _planned_only(name: str) -> FunctionBackend:
    """The backend's own contract on a stand-in that is never called: planning for a GPU this machine may lack."""
    return FunctionBackend(name, load_backend(name).contract, raises)


# The logits cases stage1's H-fold buffer cannot hold on an H200 (row starts past 2^32 bytes and past
# 2^31 and 2^32 elements need 0.3 to 1.1 TB of it); the one past 2^31 bytes (137 GB of it) still fits.
TOO_BIG_FOR_STAGE1 = {"logits-row-2^32-bytes": EdgeFamily.LOGITS_ROW_2_32_BYTES,
                      "logits-row-2^31-elements": EdgeFamily.LOGITS_ROW_2_31_ELEMENTS,
                      "logits-row-2^32-elements": EdgeFamily.LOGITS_ROW_2_32_ELEMENTS,
                      **dict.fromkeys(LOGITS_2_31, EdgeFamily.LOGITS_2_31_ELEMENTS)}


def test_a_case_another_backend_called_for_is_not_handed_to_stage1_where_it_would_not_fit():
    plan = envelope_plan([_planned_only("aiter-triton-fused"), _planned_only("aiter-triton-stage1")], H200, seed=0)
    takers = {c.spec.name: c.backends for c in plan.cases if c.spec.name in TOO_BIG_FOR_STAGE1}
    assert takers == dict.fromkeys(TOO_BIG_FOR_STAGE1, frozenset({"aiter-triton-fused"})), f"{takers=}"
    left_out = {family for family, _ in plan.omitted["aiter-triton-stage1"]}
    assert left_out == {f.value for f in TOO_BIG_FOR_STAGE1.values()}, "the reach table says why"
    contract = load_backend("aiter-triton-stage1").contract
    shaped = [c for c in plan.cases if contract.shape_reason(c.spec.next_n, c.spec.heads, c.spec.head_dim,
                                                             c.spec.block_size) is None]
    assert {c.spec.name for c in shaped if "aiter-triton-stage1" not in c.backends} == set(TOO_BIG_FOR_STAGE1), \
        "memory leaves out these, and only these, of the cases of shapes stage1 takes"


@pytest.mark.parametrize("name", ["deepgemm", "vllm-deepgemm"])
def test_deep_gemm_native_on_sm90_and_vllms_call_of_it_declare_the_same_envelope(name):
    c = load_backend(name).contract
    envelope = (c.archs, c.next_n, c.heads, c.head_dims, c.block_sizes, c.max_context, c.max_pool_bytes, c.tiles,
                c.partition)
    assert envelope == (("sm90",), (1, 2, 4), (32, 64), (32, 64, 128), (32, 64), 262144, None, (64, 256),
                        WorkPartition(256, PartitionScope.GLOBAL, None, halved_at_next_n=(4,)))


def test_the_schedule_slots_follow_the_declared_partition():
    class FakeLibrary:
        @staticmethod
        def get_num_sms() -> int:
            return 132

    native, flattened = deep_gemm.DeepGemm("deepgemm"), deep_gemm.DeepGemm("deepgemm-flattened")
    assert [native.num_sms(FakeLibrary, n) for n in (1, 2, 4)] == [132, 132, 66]
    assert flattened.num_sms(FakeLibrary, 1) == 132
    assert deep_gemm.DeepGemm("deepgemm-varlen").num_sms(FakeLibrary, 1) == 132


def test_vllm_triton_decode_declares_its_tile_but_no_contiguous_partition():
    c = load_backend("vllm-triton-decode").contract
    assert c.tiles == (vllm_indexer.TRITON_BLOCK_KV,) == (64,)
    assert c.block_sizes == (64, 128, 256) and all(b % 64 == 0 for b in c.block_sizes)
    assert c.partition is None, "strided splits, not contiguous ranges"


@pytest.mark.parametrize("name", ["torch", "vllm-torch-ref"])
def test_plain_torch_backends_have_no_envelope(name):
    c = load_backend(name).contract
    assert (c.next_n, c.heads, c.head_dims, c.block_sizes, c.max_context, c.max_pool_bytes) == (None,) * 6
    assert (c.tiles, c.partition, c.heads_multiple_of, c.heads_power_of_two) == ((), None, 1, False)


@pytest.mark.parametrize("module", [torch_ref, deep_gemm, aiter_triton, aiter_rocm, vllm_indexer, vllm_step5, sglang,
                                    flashinfer, flag_gems],
                         ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_backends_ask_difftest_hardware_about_the_gpu(module):
    """One reason string and one arch spelling: no backend's code asks torch itself."""
    asked = {ast.unparse(node) for node in ast.walk(ast.parse(inspect.getsource(module)))
             if isinstance(node, ast.Attribute)}
    questions = {"torch.cuda.is_available", "torch.cuda.get_device_capability", "torch.cuda.get_device_properties",
                 "torch.version.hip"}
    assert not asked & questions, f"{module.__name__} asks {sorted(asked & questions)} itself"
