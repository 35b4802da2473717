"""The compiled top-k backends (vLLM's _C ops, SGLang's JIT kernels, FlashInfer's): each says exactly why it
cannot run here, and declares its kernel's conventions. They run on the GPU machine (scripts/device_visit.sh topk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.backends import flashinfer_topk, sglang_topk, topk_base, vllm_topk
from difftest.core.kinds import IndexConvention, RowStride, TopkPadding, WindowForm
from difftest.core.topk import encode_topk
from difftest.generators.topk import TopkSpec, WindowDist, build_topk_case

COMPILED = {**vllm_topk.TOPK_BACKENDS, **sglang_topk.TOPK_BACKENDS, **flashinfer_topk.TOPK_BACKENDS}


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_cpu_reason_names_cuda(name):
    backend = COMPILED[name]()
    assert backend.name == name and isinstance(backend, topk_base.TopkBackend)
    reason = backend.unavailable_reason("cpu")
    assert reason and "cuda" in reason.lower(), reason
    assert backend.contract.devices == ("cuda",)


def test_missing_files_are_named(monkeypatch, tmp_path):
    monkeypatch.setenv(topk_base.DEPS_VARIABLE, str(tmp_path))
    monkeypatch.setattr("difftest.core.hardware.cuda_unavailable_reason", lambda: None)
    reason = vllm_topk.VllmTopk("vllm-persistent-topk").unavailable_reason("cuda")
    assert str(tmp_path / vllm_topk.SO_NAME) in reason and "prepare_topk_deps.sh" in reason, reason
    reason = sglang_topk.SglangJitTopk("sglang-jit-fast-topk").unavailable_reason("cuda")
    assert "fast_topk.cuh not found" in reason, reason


def test_declared_conventions_follow_the_notes():
    persistent = vllm_topk.VllmTopk("vllm-persistent-topk").contract
    assert persistent.ks == (512, 1024, 2048) and persistent.window == WindowForm.LENGTHS
    assert persistent.padding == TopkPadding.PAST_WINDOW and persistent.index == IndexConvention.ROW_RELATIVE
    cooperative = vllm_topk.VllmTopk("vllm-cooperative-topk").contract
    assert cooperative.max_rows == 64 and cooperative.row_stride == RowStride.MULTIPLE_OF_4
    assert vllm_topk.VllmTopk("vllm-top-k-per-row-decode").contract.window == WindowForm.DECODE_RULE
    v2 = sglang_topk.SglangJitTopk("sglang-jit-topk-v2-ragged").contract
    assert v2.index == IndexConvention.ABSOLUTE and v2.max_k == 2048 and v2.mutates_logits
    assert flashinfer_topk.FlashInferTopk.contract.row_stride == RowStride.EQUALS_WIDTH  # topk.cu:182 CHECK_INPUT
    assert flashinfer_topk.FlashInferTopk().contract.max_k == 2048


def test_a_vllm_call_loads_the_extension_itself(monkeypatch, tmp_path):
    """An isolated worker calls the backend without asking unavailable_reason first: the call loads the .so
    (here it cannot: no file), rather than finding torch.ops._C without the op."""
    monkeypatch.setenv(topk_base.DEPS_VARIABLE, str(tmp_path))
    vllm_topk._load.cache_clear()  # the load is cached per process: this test's answer must not stay
    backend = vllm_topk.VllmTopk("vllm-persistent-topk")
    case = build_topk_case(TopkSpec(rows=2, width=64, k=8, windows=WindowDist.FULL), 0, "cpu")
    try:
        with pytest.raises(RuntimeError, match=r"torch\.ops\.load_library\(.*_C_stable_libtorch\.abi3\.so'\) fail"):
            backend(encode_topk(case, backend.contract), None)
    finally:
        vllm_topk._load.cache_clear()


def test_a_planted_deps_folder_in_the_working_folder_is_never_loaded(monkeypatch, tmp_path):
    """The carried files were looked for under the working folder: a replay run from a folder holding a planted
    .device-deps/topk/vllm_C/*.so (a bundle's, say) loaded that library into the process. Without
    DIFFTEST_TOPK_DEPS they are the installation's (beside the difftest package), wherever the command runs."""
    planted = tmp_path / topk_base.DEFAULT_DEPS / vllm_topk.SO_NAME
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"\x7fELF planted")
    (tmp_path / topk_base.DEFAULT_DEPS / sglang_topk.SOURCES).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(topk_base.DEPS_VARIABLE, raising=False)
    installed = Path(topk_base.__file__).resolve().parents[2] / topk_base.DEFAULT_DEPS
    assert topk_base.deps_dir() == installed and topk_base.deps_dir().is_absolute()
    assert str(tmp_path) not in vllm_topk.library_path() and str(tmp_path) not in str(sglang_topk.sources_dir())
    backend = vllm_topk.VllmTopk("vllm-persistent-topk")
    assert str(installed) in backend.contract.library, backend.contract.library
    vllm_topk._load.cache_clear()
    try:
        reason = vllm_topk._load()
    finally:
        vllm_topk._load.cache_clear()
    assert reason is None or (str(tmp_path) not in reason and str(installed) in reason), reason


def test_the_deps_variable_names_the_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(topk_base.DEPS_VARIABLE, str(tmp_path))
    assert topk_base.deps_dir() == tmp_path
