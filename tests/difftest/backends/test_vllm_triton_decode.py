"""vLLM's Triton decode kernel loaded from a copy of its file, without vllm (vllm_triton_decode).

Which copy: the first sys.path entry holding the file, checked with planted files (empty: only
their paths matter). The kernel itself: the vllm 0.33.0 copy scripts/prepare_versions.sh extracts
into .device-deps/versions/ from the release wheel, run under the Triton interpreter against the
oracle; where that tree is absent (CI: no wheel cache, no .device-deps) those tests skip saying so.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from difftest.backends import load_backend
from difftest.backends import vllm_triton_decode as vtd
from difftest.core.kinds import LengthEncoding
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case

TREE = Path(__file__).resolve().parents[3] / ".device-deps/versions/vllm-0.33.0"
needs_tree = pytest.mark.skipif(
    not (TREE / vtd.FILE).is_file(),
    reason=f"no {TREE / vtd.FILE}: scripts/prepare_versions.sh extracts it from the vllm 0.33.0 wheel")


def plant(root: Path, *, whole_vllm: bool = False, version: str | None = None) -> Path:
    """A directory holding an (empty) file at the kernel file's path, optionally vllm's __init__ and _version."""
    (root / vtd.FILE).parent.mkdir(parents=True)
    (root / vtd.FILE).touch()
    if whole_vllm:
        (root / "vllm/__init__.py").touch()
    if version:
        (root / vtd.VERSION_FILE).write_text(f"__version__ = version = '{version}'\n")
    return root


def test_the_first_entry_holding_the_file_is_chosen(tmp_path):
    first, second = plant(tmp_path / "a", version="0.31.0"), plant(tmp_path / "b", version="0.34.0")
    tree = vtd.find_tree([str(tmp_path / "empty"), str(first), str(second)])
    assert tree == vtd.KernelTree(first.resolve())
    assert (tree.version(), tree.whole_vllm) == ("0.31.0", False)
    assert tree.describe() == (f"vllm 0.31.0 (rocm_fp8_paged_mqa_logits_triton from {first.resolve() / vtd.FILE}, "
                               f"vllm not imported)")
    assert vtd.find_tree([str(second), str(first)]).version() == "0.34.0"
    assert vtd.find_tree([str(tmp_path / "empty")]) is None


def test_an_installed_vllm_first_on_the_path_is_imported_not_loaded_from_its_file(tmp_path, monkeypatch):
    installed, carried = plant(tmp_path / "site", whole_vllm=True), plant(tmp_path / "carried")
    monkeypatch.setattr(sys, "path", [str(installed), str(carried)])
    assert vtd.find_tree().whole_vllm and vtd.carried_tree() is None
    monkeypatch.setattr(sys, "path", [str(carried), str(installed)])
    assert vtd.carried_tree() == vtd.KernelTree(carried.resolve())


def test_a_copy_without_the_kernel_is_unavailable_with_the_loader_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(plant(tmp_path / "empty-copy")), *sys.path])
    reason = load_backend("vllm-triton-decode").unavailable_reason("cpu")
    assert reason == (f"loading {', '.join(vtd.DEFS)} from {(tmp_path / 'empty-copy').resolve() / vtd.FILE} "
                      f"failed: LookupError: {(tmp_path / 'empty-copy').resolve() / vtd.FILE} defines no "
                      f"{', '.join(vtd.DEFS)}")


@pytest.fixture
def vllm_0_33(monkeypatch):
    """The 0.33.0 copy first on sys.path, as PYTHONPATH=.device-deps/versions/vllm-0.33.0 puts it."""
    monkeypatch.setattr(sys, "path", [str(TREE), *sys.path])


def cases(next_n: int) -> list:
    """Lengths around the kernel's 64-token tile and both sides of next_n, in 64- and 128-token blocks."""
    return [build_case(CaseSpec(batch=4, next_n=next_n, heads=16, head_dim=32, block_size=block,
                                max_model_len=200, lengths=(0, next_n - 1, 64, 129)), seed)
            for seed, block in enumerate((64, 128))]


@needs_tree
def test_the_carried_copy_reads_from_its_file_and_runs_on_the_cpu(vllm_0_33):
    backend = load_backend("vllm-triton-decode")
    assert backend.unavailable_reason("cpu") is None
    assert backend.contract.library.startswith(f"vllm 0.33.0 (rocm_fp8_paged_mqa_logits_triton from {TREE / vtd.FILE}")
    assert backend.contract.devices == ("cpu", "cuda")


@needs_tree
@pytest.mark.parametrize("next_n", [1, 3])
def test_it_agrees_with_the_oracle_given_per_row_lengths(vllm_0_33, next_n):
    """The (B, next_n) table vLLM's indexer passes: the wrapper's CTX_PER_ROW branch."""
    results = run([load_backend("vllm-triton-decode")], cases(next_n), RunConfig(isolate=False))
    assert {r.verdict for r in results} == {Verdict.PASS}, [(r.case, r.verdict, r.reason) for r in results]


@needs_tree
def test_it_agrees_with_the_oracle_given_per_sequence_lengths(vllm_0_33):
    """One length per sequence (the vllm#59420 what-if): the wrapper sees B lengths at next_n > 1 and
    derives each draft row's window in the kernel, so this kernel reads both encodings right."""
    results = run([load_backend("vllm-triton-decode")], cases(3),
                  RunConfig(isolate=False, encoding=LengthEncoding.PER_SEQUENCE))
    assert {r.verdict for r in results} == {Verdict.PASS}, [(r.case, r.verdict, r.reason) for r in results]
