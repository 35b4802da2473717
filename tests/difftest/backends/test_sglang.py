"""sglang 0.5.23's paged-logits functions from the release wheel's files (difftest.backends.sglang): the torch
reference indexer run on the CPU against the oracle; the TileLang kernel's reasons (it runs on sm90 only)."""

from __future__ import annotations

import sys

import torch

from difftest.backends import carried, load_backend
from difftest.backends import sglang as sgl
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import LengthEncoding, MaskConvention
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, Values, build_case


def case(lengths: tuple[int, ...], next_n: int = 1, heads: int = 16, max_model_len: int = 128, seed: int = 0,
         **spec: object):
    """An sglang-shaped case: D 128, pages of 64."""
    return build_case(CaseSpec(batch=len(lengths), next_n=next_n, heads=heads, head_dim=128, block_size=64,
                               max_model_len=max_model_len, lengths=lengths, **spec), seed)


def test_the_contracts_are_the_functions_asserts_and_their_callers_use():
    ref, tile = (load_backend(n).contract for n in sgl.PATHS)
    for contract in (ref, tile):
        assert (contract.length_encoding, contract.mask, contract.head_dims, contract.block_sizes) == \
            (LengthEncoding.FLATTENED, MaskConvention.TAIL_UNSPECIFIED, (128,), (64,))
    assert (ref.devices, ref.archs, ref.heads, ref.rtol) == (("cpu", "cuda"), None, None, 2.0 ** -8 * 16)
    assert ref.working_memory.bytes_for(logits=10, heads=64) == 10 * (540 + 64 * 8)
    assert (tile.devices, tile.archs, tile.heads, tile.tiles, tile.partition) == \
        (("cuda",), ("sm90",), (8, 16, 128), (64,), None)


def test_tilelang_is_a_gpu_kernel_and_says_so_on_the_cpu():
    assert load_backend("sglang-tilelang").unavailable_reason("cpu") == \
        "tilelang_fp8_paged_mqa_logits runs on cuda only (device cpu)"


def test_without_a_copy_of_the_file_it_says_where_the_file_comes_from(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert load_backend("sglang-torch-ref").unavailable_reason("cpu") == \
        carried.missing_reason((sgl.PATHS["sglang-torch-ref"].file,), "sglang 0.5.23")


def test_the_torch_reference_agrees_with_the_oracle_within_a_bf16_products_error(on_path):
    """Per-row lengths (flattened next_n 2), empty rows, lengths around the 64-token page, a wider table
    than max_model_len (the call passes the table's width and keeps max_model_len columns), heavy-tailed
    values, and H 8 and 64."""
    folder = on_path("sglang-0.5.23")
    backend = load_backend("sglang-torch-ref")
    assert backend.unavailable_reason("cpu") is None
    assert backend.contract.library == (f"sglang 0.5.23 (fp8_paged_mqa_logits_torch from "
                                        f"{folder / sgl.PATHS['sglang-torch-ref'].file}, sglang not imported)")
    cases = [case((0, 1, 63, 64, 65), next_n=2, heads=8, seed=1, extra_columns=2),
             case((128, 70), heads=64, seed=2, values=Values.HEAVY)]
    got = run([backend], cases, RunConfig(isolate=False))
    assert [r.verdict for r in got] == [Verdict.PASS] * 2, [(r.case, r.verdict, r.reason) for r in got]


def test_the_torch_reference_writes_zero_past_each_rows_length_not_minus_infinity(on_path):
    """indexer.py:138: the tail is 0.0, so the contract leaves it unspecified (the top-k masks it)."""
    on_path("sglang-0.5.23")
    backend = load_backend("sglang-torch-ref")
    inputs = encode(case((3, 0), max_model_len=100), backend.contract)
    logits = backend(inputs, None)
    assert logits.shape == (2, 100) and logits.dtype == torch.float32
    assert torch.isfinite(logits[0, :3]).all() and logits[0, :3].ne(0).any()
    assert logits[0, 3:].eq(0).all() and logits[1].eq(0).all()


def test_a_file_without_the_function_is_unavailable_with_the_loader_error(monkeypatch, tmp_path):
    relative = sgl.PATHS["sglang-torch-ref"].file
    (tmp_path / relative).parent.mkdir(parents=True)
    (tmp_path / relative).write_text("import torch\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    found = tmp_path.resolve() / relative
    assert load_backend("sglang-torch-ref").unavailable_reason("cpu") == \
        f"loading fp8_paged_mqa_logits_torch from {found} failed: LookupError: {found} defines no " \
        f"fp8_paged_mqa_logits_torch"
