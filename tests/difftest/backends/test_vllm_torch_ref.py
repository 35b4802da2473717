"""vLLM's paged torch reference run from a release's own file, without vllm (difftest.backends.vllm_torch_ref).

The release table and the loader's answers are checked with planted files; the functions themselves
with the 0.33.0 and 0.34.0 files scripts/prepare_field_deps.py extracts into .device-deps/field/
(the `on_path` fixture; where they cannot be had, those tests skip with the script's reason).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from difftest.backends import load_backend
from difftest.backends import vllm_torch_ref as vtr
from difftest.backends.vllm_triton_decode import FILE, VERSION_FILE, KernelTree
from difftest.core.spec import Values
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import CaseSpec, build_case

# A stand-in for the file: the reference's signature, reading `cdiv` as the real one does.
PLANTED = """
def fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len):
    from vllm.utils.math_utils import cdiv
    return cdiv(max_model_len, 16)

def _unshuffle_indexer_k_values(values, block_size, dim):
    return values
"""


def plant(root: Path, version: str, source: str = PLANTED) -> KernelTree:
    """A carried tree: the file with `source` and a vllm/_version.py naming `version`."""
    (root / FILE).parent.mkdir(parents=True)
    (root / FILE).write_text(source)
    (root / VERSION_FILE).write_text(f"__version__ = version = '{version}'\n")
    return KernelTree(root)


def test_the_table_holds_the_two_releases_and_what_each_executes():
    assert list(vtr.RELEASES) == ["0.33.0", "0.34.0"]
    assert vtr.RELEASES["0.33.0"].defs == (vtr.FUNCTION,)
    assert vtr.RELEASES["0.34.0"].defs == (vtr.FUNCTION, "_unshuffle_indexer_k_values")
    assert [r.caller.split(" ")[0] for r in vtr.RELEASES.values()] == ["rocm_aiter_mla_sparse.py:805",
                                                                     "rocm_aiter_mla_sparse.py:865"]


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_a_known_release_is_found_loaded_and_given_cdiv(tmp_path, version):
    tree = plant(tmp_path, version)
    assert vtr.release_of(tree) == (vtr.RELEASES[version], None)
    assert vtr.reason(tree) is None
    assert vtr.describe(tree) == (f"vllm {version} (fp8_paged_mqa_logits_torch from {tree.file}, vllm not imported; "
                                  f"called as {vtr.RELEASES[version].caller})")
    assert getattr(vtr.load(tree, vtr.RELEASES[version]), vtr.FUNCTION)(None, None, None, None, None, 33) == 3


def test_a_release_the_table_does_not_know_is_not_called(tmp_path):
    tree = plant(tmp_path, "0.35.0")
    why = (f"{tree.file} is vllm 0.35.0; fp8_paged_mqa_logits_torch is called as the releases 0.33.0, 0.34.0 "
           f"call it (difftest.backends.vllm_torch_ref.RELEASES)")
    assert vtr.release_of(tree) == (None, why)
    assert vtr.reason(tree) == why
    with pytest.raises(RuntimeError, match=r"is vllm 0\.35\.0"):
        vtr.call(tree, None)


def test_a_file_reading_more_of_vllm_is_unavailable_naming_it(tmp_path):
    tree = plant(tmp_path, "0.33.0", "def fp8_paged_mqa_logits_torch(*args):\n    return envs.X\n")
    assert vtr.reason(tree) == (f"fp8_paged_mqa_logits_torch in {tree.file} reads ['envs'], which only vllm "
                                f"itself provides")
    assert vtr.reason(plant(tmp_path / "none", "0.34.0", "x = 1\n")).startswith(
        f"loading fp8_paged_mqa_logits_torch, _unshuffle_indexer_k_values from {tmp_path / 'none' / FILE} failed: "
        f"LookupError:")


def test_the_backend_takes_the_carried_copy_first_on_the_path(tmp_path, monkeypatch):
    tree = plant(tmp_path, "0.34.0")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    backend = load_backend("vllm-torch-ref")
    assert backend.unavailable_reason("cpu") is None
    assert backend.contract.library == vtr.describe(KernelTree(tree.root.resolve()))


# --------------------------------------------------------------------------- the releases' own files

def cases(next_n: int) -> list:
    """Lengths both sides of next_n and of the 16-token block, a padding request among them."""
    return [build_case(CaseSpec(batch=4, next_n=next_n, heads=4, head_dim=32, block_size=16, max_model_len=64,
                                lengths=(0, next_n - 1, 17, 64)), seed) for seed in range(2)]


def verdicts(cases_: list) -> set[Verdict]:
    return {r.verdict for r in run([load_backend("vllm-torch-ref")], cases_, RunConfig(isolate=False))}


@pytest.mark.parametrize("next_n", [1, 2, 3])
def test_0_34_0_agrees_with_the_oracle_at_every_next_n(on_path, next_n):
    on_path("vllm-0.34.0")
    assert verdicts(cases(next_n)) == {Verdict.PASS}


def test_0_33_0_reads_the_mtp_cache_token_interleaved(on_path):
    """docs/findings/vllm-torch-ref-layout.md, now from the release's file: next_n 1 passes, 2 does not."""
    on_path("vllm-0.33.0")
    assert verdicts(cases(1)) == {Verdict.PASS}
    assert verdicts(cases(2)) == {Verdict.FAIL_NAN}


# The shrunk case of docs/findings/vllm-torch-ref-unaligned-max-model-len.md.
SMALLEST = CaseSpec(name="unaligned-max-model-len-113-min", batch=1, next_n=2, heads=1, head_dim=16,
                    max_model_len=113, lengths=(113,), values=Values.INTEGER)


@pytest.mark.parametrize("release", ["vllm-0.33.0", "vllm-0.34.0"])
def test_both_raise_when_a_last_block_reaches_past_max_model_len(on_path, release):
    on_path(release)
    (result,) = run([load_backend("vllm-torch-ref")], [build_case(SMALLEST, 0)], RunConfig(isolate=False))
    assert result.verdict == Verdict.ERROR
    assert result.reason.startswith("RuntimeError: The expanded size of the tensor (1) must match the existing "
                                    "size (16) at non-singleton dimension 1"), result.reason
