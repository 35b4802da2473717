"""FlashInfer 0.7.2.post1 (difftest.backends.flashinfer): the CuTe-DSL kernel's reasons (sm100, sm103 and
sm107 only: never run here), and its torch reference from the release wheel's file, on the CPU against
the oracle. Its CPU schedule is checked against FlagGems' in test_flag_gems.py."""

from __future__ import annotations

import sys

from difftest.backends import carried, load_backend
from difftest.backends import flashinfer as fi
from difftest.core import hardware
from difftest.core.kinds import LengthEncoding, MaskConvention, PartitionScope
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case


def test_the_kernel_says_which_gpus_it_runs_on_wherever_it_cannot(monkeypatch):
    kernel = load_backend("flashinfer")
    assert kernel.unavailable_reason("cpu") == \
        "FlashInfer's fp8_paged_mqa_logits runs on sm100/sm103/sm107 GPUs only (device cpu)"
    monkeypatch.setattr(hardware, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(hardware, "arch", lambda index=None: "sm90")
    assert kernel.unavailable_reason("cuda") == \
        "FlashInfer's fp8_paged_mqa_logits runs on sm100/sm103/sm107 only (attn_scores.py:759), this GPU is sm90"


def test_the_kernels_contract_is_its_support_check():
    contract = load_backend("flashinfer").contract
    assert (contract.length_encoding, contract.mask, contract.devices, contract.archs) == \
        (LengthEncoding.PER_SEQUENCE, MaskConvention.TAIL_UNSPECIFIED, ("cuda",), ("sm100", "sm103", "sm107"))
    assert all(n * h % 8 == 0 and 8 <= n * h <= 256 for n in contract.next_n for h in contract.heads)
    assert (contract.head_dims, contract.block_sizes, contract.tiles) == ((32, 64, 128), (32, 64, 128), (128, 256))
    assert (contract.partition.unit_tokens, contract.partition.scope) == (256, PartitionScope.GLOBAL)


def test_the_reference_without_its_file_says_where_the_file_comes_from(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert load_backend("flashinfer-ref").unavailable_reason("cpu") == \
        carried.missing_reason((fi.REFERENCE_FILE,), "flashinfer-python 0.7.2.post1")


def test_the_reference_agrees_with_the_oracle_per_sequence(on_path):
    """One length per sequence, each draft row's window derived by the reference (next_n 1 and 3, lengths
    shorter than next_n, a page boundary, a max_model_len that is no multiple of the page)."""
    folder = on_path("flashinfer-0.7.2.post1")
    backend = load_backend("flashinfer-ref")
    assert backend.unavailable_reason("cpu") is None
    assert backend.contract.library == (f"flashinfer-python 0.7.2.post1 (_fp8_paged_mqa_logits_reference from "
                                        f"{folder / fi.REFERENCE_FILE}, flashinfer not imported)")
    cases = [build_case(CaseSpec(batch=5, next_n=3, heads=16, head_dim=64, block_size=32, max_model_len=100,
                                 lengths=(0, 1, 2, 32, 100)), 1),
             build_case(CaseSpec(batch=2, next_n=1, heads=8, head_dim=32, block_size=64, max_model_len=65,
                                 lengths=(65, 64)), 2)]
    got = run([backend], cases, RunConfig(isolate=False))
    assert [r.verdict for r in got] == [Verdict.PASS] * 2, [(r.case, r.verdict, r.reason) for r in got]
