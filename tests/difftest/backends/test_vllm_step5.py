"""vLLM's Step5 Hopper kernel, paged_mqa_logits_sm90, from the release wheels' file, under the Triton
interpreter (difftest.backends.vllm_step5).

Its two callers: the flattened one agrees with the oracle; the paired one gives the first row of each
pair the second row's length, which the oracle's per-row causal limit does not allow: FAIL(mask) on
exactly those rows, and a copy of the kernel whose length line takes the row's own window passes
(docs/findings/vllm-step5-shared-length.md).
"""

from __future__ import annotations

import sys

import pytest

from difftest.backends import carried, load_backend
from difftest.backends import vllm_step5 as step5
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case

RELEASES = {"vllm-0.33.0": step5.FILES[1], "vllm-0.34.0": step5.FILES[0]}


def case(lengths: tuple[int, ...], next_n: int = 1, heads: int = 8, max_model_len: int = 96, seed: int = 0,
         **spec: object):
    """A Step5-shaped case: D 256, pages of 32."""
    return build_case(CaseSpec(batch=len(lengths), next_n=next_n, heads=heads, head_dim=256, block_size=32,
                               max_model_len=max_model_len, lengths=lengths, **spec), seed)


def results(name: str, cases: list) -> list:
    return run([load_backend(name)], cases, RunConfig(isolate=False))


def test_the_contracts_are_the_kernels_facts_as_each_caller_uses_them():
    flat, paired = (load_backend(n).contract for n in ("vllm-step5", "vllm-step5-paired"))
    for contract in (flat, paired):
        assert (contract.cache_layout, contract.mask, contract.head_dims, contract.block_sizes, contract.tiles) == \
            (CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF, (256,), (32,), (32,))
        assert (contract.devices, contract.archs, contract.max_context, contract.partition) == \
            (("cpu", "cuda"), ("sm90",), None, None)
    assert (flat.length_encoding, flat.next_n, flat.heads) == (LengthEncoding.FLATTENED, None, (4, 8, 16))
    assert (paired.length_encoding, paired.next_n, paired.heads) == (LengthEncoding.PER_SEQUENCE, (2,), (4,))


def test_without_a_copy_of_the_file_it_says_where_the_file_comes_from(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert load_backend("vllm-step5").unavailable_reason("cpu") == \
        carried.missing_reason(step5.FILES, "vllm 0.33.0 or 0.34.0")


def test_a_file_without_the_kernel_is_unavailable_with_the_loader_error(monkeypatch, tmp_path):
    (tmp_path / step5.FILES[0]).parent.mkdir(parents=True)
    (tmp_path / step5.FILES[0]).write_text("import torch\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    path = tmp_path.resolve() / step5.FILES[0]
    assert load_backend("vllm-step5").unavailable_reason("cpu") == \
        f"loading _paged_scores_sm90, paged_mqa_logits_sm90 from {path} failed: LookupError: {path} defines no " \
        f"_paged_scores_sm90, paged_mqa_logits_sm90"


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_is_found_under_its_own_path_and_named(on_path, release):
    folder = on_path(release)
    backend = load_backend("vllm-step5")
    assert backend.unavailable_reason("cpu") is None
    assert backend.contract.library == (f"vllm {release.removeprefix('vllm-')} (paged_mqa_logits_sm90 from "
                                        f"{folder / RELEASES[release]}, vllm not imported)")


def test_the_flattened_caller_agrees_with_the_oracle(on_path):
    """One length and one table row per query row (next_n 2 and 3 flattened), heads 4, 8 and 16, lengths
    around the 32-position tile and page, empty rows, and a table wider than max_model_len."""
    on_path("vllm-0.34.0")
    cases = [case((0, 1, 31, 32, 33, 64), next_n=2, heads=4, seed=1),
             case((65, 3, 0), next_n=3, heads=16, max_model_len=80, seed=2, extra_columns=1),
             case((96, 17), heads=8, seed=3)]
    got = results("vllm-step5", cases)
    assert [r.verdict for r in got] == [Verdict.PASS] * 3, [(r.case, r.verdict, r.reason) for r in got]


def test_the_paired_caller_gives_the_first_row_of_each_pair_the_second_rows_length(on_path):
    """Rows 2b (draft position 0) see L_b positions where their window holds L_b - 1: FAIL(mask) on exactly
    those rows whose L_b >= 1, each behaving as if its limit were L_b; the second rows pass."""
    on_path("vllm-0.34.0")
    got = results("vllm-step5-paired", [case((1, 0, 33, 64), next_n=2, heads=4)])[0]
    assert got.verdict == Verdict.FAIL_MASK
    assert got.comparison.mask_rows == [0, 4, 6]
    # (row, the oracle's limit, the limit the kernel behaved as having)
    assert [tuple(limit) for limit in got.comparison.mask_limits] == [(0, 0, 1), (4, 32, 33), (6, 63, 64)]
    assert got.comparison.value_rows == [] and got.comparison.nan_rows == []


def test_a_copy_whose_length_is_the_rows_own_window_passes(on_path, monkeypatch, tmp_path):
    """The diagnosis checked: replace the one line that loads the shared length (:220) with the row's
    causal limit, L - NEXT_N + 1 + (row % NEXT_N), and the paired caller's cases pass."""
    source = (on_path("vllm-0.34.0") / step5.FILES[0]).read_text()
    shared = "    length = tl.load(Lengths + batch * LENGTH_STRIDE)\n"
    assert source.count(shared) == 1
    patched = tmp_path / step5.FILES[0]
    patched.parent.mkdir(parents=True)
    patched.write_text(source.replace(shared, shared.rstrip("\n") + " - NEXT_N + 1 + row % NEXT_N\n"))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    got = results("vllm-step5-paired", [case((1, 0, 33, 64), next_n=2, heads=4), case((2, 95), next_n=2, heads=4,
                                                                                      seed=1)])
    assert [r.verdict for r in got] == [Verdict.PASS] * 2, [(r.case, r.verdict, r.reason) for r in got]
