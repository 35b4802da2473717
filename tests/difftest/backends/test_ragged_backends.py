"""The ragged logits backends: DeepGEMM's contract facts, its CPU skip and its call bound against both vendored
signatures (read from the release wheels' _C.py, never loaded); on an sm90 GPU, DeepGEMM against the fast oracle
over its small plan. vLLM's and sglang's torch references run from their release files (scripts/
prepare_field_deps.py) over the whole small plan, on the CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from difftest.backends import aiter_ragged, deep_gemm_ragged, sglang_ragged, vllm_ragged
from difftest.backends.deep_gemm_ragged import DeepGemmRagged
from difftest.backends.ragged_base import RaggedBackend
from difftest.core import hardware
from difftest.core.kinds import LogitsForm, MaskConvention, OracleKind
from difftest.core.ragged import RaggedCase, encode_ragged
from difftest.core.verdict import Verdict
from difftest.engine.ragged_comparison import RaggedComparison, compare_ragged
from difftest.generators.envelope import Target
from difftest.generators.ragged import RaggedPlanned, RaggedSpec, build_ragged_case, ragged_plan
from difftest.oracles.ragged_reference import make_ragged_reference
from tests.difftest.backends.test_deep_gemm import bound_arguments, signature_of

TABLES = {**deep_gemm_ragged.RAGGED_BACKENDS, **vllm_ragged.RAGGED_BACKENDS, **sglang_ragged.RAGGED_BACKENDS,
          **aiter_ragged.RAGGED_BACKENDS}
ON_SM90 = torch.cuda.is_available() and DeepGemmRagged().unavailable_reason("cuda") is None
NOT_SM90 = (hardware.CUDA_UNAVAILABLE if not torch.cuda.is_available()
            else DeepGemmRagged().unavailable_reason("cuda") or "")


def run(backend: RaggedBackend, case: RaggedCase, oracle: OracleKind = OracleKind.EXACT) -> RaggedComparison:
    contract = backend.contract
    got = backend(encode_ragged(case, contract), None)
    return compare_ragged(make_ragged_reference(case, contract.width(case), oracle), got, case, contract)


def test_every_table_entry_is_a_ragged_backend_named_as_listed():
    for name, make in TABLES.items():
        backend = make()
        assert isinstance(backend, RaggedBackend) and backend.name == name


def test_deepgemm_declares_the_sm90_kernels_facts():
    contract = DeepGemmRagged().contract
    assert (contract.form, contract.mask) == (LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_UNSPECIFIED)
    assert contract.heads == (32, 64) and contract.head_dims == (32, 64, 128) and contract.archs == ("sm90",)
    assert contract.tiles.kv == (64, 256) and contract.tiles.block_q(64) == 2 and contract.tiles.start_align == 4
    assert contract.devices == ("cuda",) and contract.rtol == 1e-2
    assert DeepGemmRagged().unavailable_reason("cpu") == "DeepGEMM runs on CUDA GPUs only (device cpu)"


@pytest.fixture
def vendored(field_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """deep_gemm as the backend sees it, with a vendored build's fp8_fp4_mqa_logits signature (a fake that returns
    how its arguments bound)."""

    def install(release: str) -> None:
        source = (field_tree / f"deep_gemm-api-{release}" / "vllm/third_party/deep_gemm/_C.py").read_text()
        module = types.SimpleNamespace(fp8_fp4_mqa_logits=bound_arguments(signature_of(source, "fp8_fp4_mqa_logits")))
        monkeypatch.setattr(deep_gemm_ragged, "loaded_module", lambda: module)

    return install


@pytest.mark.parametrize("release", ["vllm-0.33.0", "vllm-0.34.0"])
def test_deepgemm_is_called_as_vllms_prefill_calls_it_under_both_signatures(vendored, release):
    vendored(release)
    backend = DeepGemmRagged()
    case = build_ragged_case(RaggedSpec(rows=4, keys=50, max_seqlen_k=60), 0)
    inputs = encode_ragged(case, backend.contract)
    bound = backend(inputs, None)
    assert bound["q"] == (inputs.q, None) and bound["kv"] == (inputs.k, inputs.k_scale)
    assert bound["cu_seq_len_k_start"] is inputs.k_start and bound["cu_seq_len_k_end"] is inputs.k_end
    assert bound["max_seqlen_k"] == 60 and bound["schedule_meta"] is None
    assert bound.get("logits_dtype", torch.float32) == torch.float32 and inputs.k_start.dtype == torch.int32


@pytest.mark.gpu
@pytest.mark.skipif(not ON_SM90, reason=NOT_SM90)
def test_deepgemm_over_its_small_plan_on_sm90():
    backend = DeepGemmRagged()
    for planned in ragged_plan(backend.contract, Target.small_cpu()):
        if isinstance(planned, RaggedPlanned):
            case = build_ragged_case(planned.spec, 0, device="cuda")
            result = run(backend, case, OracleKind.FAST)
            assert result.verdict == Verdict.PASS, f"{planned.spec.name}: {result.headline()}"


@pytest.mark.parametrize(("name", "release"), [("vllm-torch-ref-ragged", "vllm-0.33.0"),
                                               ("sglang-torch-ref-ragged", "sglang-0.5.23")])
def test_torch_references_pass_their_small_plan(on_path, name, release):
    folder = on_path(release)
    backend = TABLES[name]()
    assert backend.unavailable_reason("cpu") is None and str(folder) in backend.contract.library
    assert backend.contract.library.startswith(release.replace("-", " ").rsplit(" ", 1)[0])
    for planned in ragged_plan(backend.contract, Target.small_cpu()):
        if isinstance(planned, RaggedPlanned):
            result = run(backend, build_ragged_case(planned.spec, 0))
            assert result.verdict == Verdict.PASS, f"{name} on {planned.spec.name}: {result.headline()}"


def test_sglangs_zero_fill_is_why_its_tail_is_unspecified(on_path):
    """Its 0.0 outside the windows would be a wrong mask under a cleaned contract: the declared convention matters."""
    on_path("sglang-0.5.23")
    backend = TABLES["sglang-torch-ref-ragged"]()
    case = build_ragged_case(RaggedSpec(rows=4, keys=60, heads=4, head_dim=32), 1)
    got = backend(encode_ragged(case, backend.contract), None)
    columns = torch.arange(case.keys)
    outside = (columns < case.k_start[:, None]) | (columns >= case.k_end[:, None])
    assert bool(outside.any()) and bool((got[outside] == 0.0).all())
    cleaned = dataclasses.replace(backend.contract, mask=MaskConvention.TAIL_NEG_INF)
    result = compare_ragged(make_ragged_reference(case, case.keys), got, case, cleaned)
    assert result.verdict == Verdict.FAIL_MASK, result.headline()


def test_without_the_file_a_reference_says_where_it_comes_from(monkeypatch):
    monkeypatch.setattr("sys.path", ["/nonexistent"])
    reason = TABLES["vllm-torch-ref-ragged"]().unavailable_reason("cpu")
    assert reason.startswith(f"no sys.path entry holds {vllm_ragged.FILE}: scripts/prepare_field_deps.sh"), reason
    assert "vllm 0.33.0" in reason


def test_the_campaign_driver_runs_a_plan_in_a_child_and_writes_its_summary(field_tree, tmp_path):
    """scripts/ragged_campaign.py (what `device_visit.sh ragged` runs with DeepGEMM on the GPU), here with sglang's
    reference on the CPU over two specs of its small plan."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": f"{field_tree / 'sglang-0.5.23'}{os.pathsep}{root}"}
    done = subprocess.run([sys.executable, str(root / "scripts/ragged_campaign.py"), "--out", str(tmp_path),
                           "--device", "cpu", "--backend", "sglang-torch-ref-ragged", "--only", "^rows-[13]$"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["case"], r["verdict"]) for r in results] == [("rows-1-s0", "PASS"), ("rows-3-s0", "PASS")], results
    summary = (tmp_path / "summary.md").read_text()
    assert "2 of 2 planned cases" in summary and "keys-2^31-bytes: needs" in summary
