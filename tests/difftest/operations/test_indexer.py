"""The indexer operation: a paged logits backend then a top-k backend, judged by the selected set against the
tie-aware top-k of the exact logits, beside the logits stage's -inf mask; end to end through `difftest run`."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.backends import get_backends, stages
from difftest.backends.stages import Composed, Composition
from difftest.backends.torch_topk import TorchTopk
from difftest.backends.user import FunctionBackend
from difftest.cli import main
from difftest.core.kinds import ExitStatus, Headline, OperationKind
from difftest.core.spec import CaseSpec
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Named, run_one
from difftest.generators.indexer import IndexerSpec, build_indexer_case
from difftest.operations import operation
from difftest.operations.indexer import rows_in_memory
from difftest.records.bundle import load_bundle
from difftest.records.serialize import load_results

INDEXER = operation(OperationKind.INDEXER)
PLANTED = Composition("window-one-short", "torch-topk")  # the last key of every window -inf


@pytest.fixture
def planted(monkeypatch):
    """tests/user_backends.py's window-one-short as a built-in paged backend, composed with torch-topk."""
    from difftest.backends import registry

    monkeypatch.setitem(registry._builtin(), "window-one-short",
                        ("tests.user_backends", lambda: get_backends(["tests.user_backends:window_one_short"])[0]))
    monkeypatch.setattr(stages, "COMPOSITIONS", (*stages.COMPOSITIONS, PLANTED))


def _case(k: int, seed: int = 0):
    """Windows both shorter and longer than k, with MTP draft rows (row ends L - next_n + j + 1)."""
    return build_indexer_case(IndexerSpec(CaseSpec(name="ix", batch=3, next_n=2, heads=16, head_dim=64,
                                                   max_model_len=96), k), seed)


def _run(backend: Composed, case) -> object:
    return run_one(INDEXER, Named(backend.name, backend), case, RunConfig())


AITER_PINNED = "0.1.7.post2.dev18"


@pytest.mark.parametrize("logits", ["aiter-triton-fused", "aiter-triton-stage1"])
@pytest.mark.parametrize("next_n, lost", [(2, 0), (3, 1), (4, 2)])
def test_aiters_mirrored_window_costs_the_last_draft_row_its_last_keys(logits, next_n, lost):
    """AITER's pinned Triton paged kernels (docs/findings/aiter-triton-mask.md: draft row j sees p <= L - j),
    composed with the torch top-k as vLLM's ROCm decode composes them with its own: one request of 40 tokens,
    k 64, so every key of a row's window is selected. The last draft row loses its last next_n - 2 keys (padding
    where they belong); the rows that see keys past their window lose nothing, since top-k reads only the window."""
    name = f"{logits}+torch-topk"
    backend = INDEXER.backends()[name]()
    if (reason := backend.unavailable_reason("cpu")) or AITER_PINNED not in backend.logits.contract.library:
        pytest.skip(f"{name}: needs amd-aiter {AITER_PINNED} (make installs it): {reason}")
    spec = CaseSpec(name="mtp", batch=1, next_n=next_n, heads=32, head_dim=64, block_size=16, max_model_len=128,
                    lengths=(40,))
    result = _run(backend, build_indexer_case(IndexerSpec(spec, 64), 0))
    assert result.comparison.mask_rows, "the logits stage's mask is wrong at every next_n"
    assert result.selection.wrong_tokens == lost, result.headline
    assert result.selection.wrong_rows == ((next_n - 1,) if lost else ())
    assert result.verdict == (Verdict.FAIL_PADDING if lost else Verdict.FAIL_MASK)


def test_a_logits_kernel_with_a_wrong_mask_shows_both_the_wrong_sets_and_the_mask_rows(planted):
    planted = Composed(PLANTED.name, get_backends([PLANTED.logits])[0], TorchTopk())
    for k in (8, 128):  # the dropped key missing from a top-8, and from a top-k that takes every key
        result = _run(planted, _case(k))
        assert result.verdict.failed and result.operation == OperationKind.INDEXER
        assert result.selection.wrong_rows and result.selection.wrong_tokens >= len(result.selection.wrong_rows)
        assert result.comparison.mask_rows
        assert "rows select a wrong set" in result.headline and "rows with the wrong -inf mask" in result.headline
    assert _run(planted, _case(128)).verdict == Verdict.FAIL_PADDING  # the selection's verdict comes first


@pytest.mark.parametrize("name", ["torch+torch-topk", "torch+torch-topk-vllm"])
def test_the_torch_references_composed_pass_at_every_k(name):
    backend = INDEXER.backends()[name]()
    for k, seed in ((1, 0), (8, 1), (64, 2), (96, 3)):  # 96: every window shorter than k
        result = _run(backend, _case(k, seed))
        assert result.verdict == Verdict.PASS, result.headline
        assert result.selection.rows == 6 and not result.selection.wrong_rows


def test_a_top_k_that_picks_a_token_below_the_kth_value_is_a_missing_candidate():
    class DropsBest(TorchTopk):
        def __call__(self, inputs, out):
            picked = super().__call__(inputs, out)
            return torch.cat([picked[:, 1:], picked[:, :1]], dim=1).masked_fill(
                torch.arange(inputs.k) == inputs.k - 1, -1)  # the best pick replaced by padding

    backend = Composed("torch+drops-best", get_backends(["torch"])[0], DropsBest())
    result = _run(backend, _case(8))
    assert result.verdict.failed and "FAIL(missing)" in result.selection.symptoms
    assert not result.comparison.mask_rows  # the logits stage is right: only the selection is wrong


def test_compositions_are_data_naming_backends_of_their_stages():
    from difftest.backends.registry import available_names

    for composition in stages.COMPOSITIONS:
        assert composition.logits in available_names() and composition.topk in stages.topk_backends()
        assert composition.name in INDEXER.backends()
    assert INDEXER.headlines == (Headline.SELECTION, Headline.MASK)


def test_padded_logits_rows_reach_the_top_k_stage_at_their_stride():
    padded = torch.arange(3 * 8, dtype=torch.float32).reshape(3, 8)[:, :5]
    rows = rows_in_memory(padded)
    assert rows.shape == (3, 8) and rows.data_ptr() == padded.data_ptr()
    assert rows_in_memory(padded.t().contiguous().t()).is_contiguous()


def test_indexer_cases_and_specs_read_back_as_written(tmp_path):
    case = _case(8)
    back = type(case).load(case.save(tmp_path / "c.npz"))
    assert back.k == 8 and back.name == case.name and torch.equal(back.logits.q, case.logits.q)
    spec = IndexerSpec(CaseSpec(name="x", max_model_len=300), 16)
    assert IndexerSpec.from_json(spec.to_json()) == spec


def test_run_op_indexer_catches_the_planted_composition_bundles_replays_and_shrinks_it(planted, tmp_path, capsys):
    report, repro = tmp_path / "r.json", tmp_path / "repro"
    code = main(["run", "--op", "indexer", "--cases", "random", "--backends", f"torch+torch-topk,{PLANTED.name}",
                 "--report", str(report), "--repro-dir", str(repro)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED and "wrong set (tokens)" in out and "-inf-mask mismatch" in out
    results = load_results(report)
    assert {r.verdict for r in results if r.backend == "torch+torch-topk"} == {Verdict.PASS}
    assert any(r.verdict.failed for r in results if r.backend == PLANTED.name)
    bundle = next(p for p in sorted(repro.iterdir()) if (p / "bundle.json").exists())
    assert load_bundle(bundle).operation == OperationKind.INDEXER
    assert main(["replay", str(bundle)]) == ExitStatus.FAILED
    assert main(["shrink", str(bundle), "--seconds", "5", "--out", str(tmp_path / "small")]) == ExitStatus.OK
    small = load_bundle(next((tmp_path / "small").iterdir()))
    original = load_bundle(bundle).case
    assert small.verdict.failed and (small.case.logits.batch, small.case.k) <= (original.logits.batch, original.k)


def test_a_logits_stage_right_to_its_tolerance_may_pick_either_side_of_a_near_tie():
    """The selection is judged only as finely as the logits stage is: a kernel that swaps the k-th and the
    next value of a row where they lie within its contract's rtol times the row's largest logit (far more than
    the fp32 rounding bound) is right to its contract, and so is the pipeline's selection; the same swap
    beyond that tolerance fails."""
    from tests.user_backends import PER_ROW, logits_with_limits

    k, swapped = 8, []

    def swapping(reach: float):
        def kernel(q, kv_cache, weights, context_lens, block_table, max_model_len):
            logits = logits_with_limits(q, kv_cache, weights, context_lens.long(), block_table, max_model_len)
            for row, values in enumerate(logits):
                finite = values[torch.isfinite(values)]
                if finite.numel() <= k:
                    continue
                order = torch.argsort(values.masked_fill(~torch.isfinite(values), -torch.inf), descending=True)
                kth, next_ = order[k - 1], order[k]
                if values[kth] - values[next_] <= reach * 1e-2 * finite.abs().max():
                    values[kth], values[next_] = values[next_].clone(), values[kth].clone()
                    swapped.append(row)
            return logits
        return FunctionBackend(f"swap-{reach}", dataclasses.replace(PER_ROW, rtol=1e-2), kernel)

    result = _run(Composed("swap+torch-topk", swapping(0.9), TorchTopk()), _case(k))
    assert swapped, "no row had a near tie to swap: the case proves nothing"
    assert result.verdict == Verdict.PASS and not result.selection.wrong_rows, result.headline
    swapped.clear()
    result = _run(Composed("swap+torch-topk", swapping(100.0), TorchTopk()), _case(k))
    assert swapped and result.verdict.failed and result.comparison.value_rows, result.headline
