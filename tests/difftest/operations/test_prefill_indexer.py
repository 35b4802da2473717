"""The prefill indexer operation: a ragged logits backend then a top-k backend over each row's key window,
judged by the selected set against the tie-aware top-k of the exact logits, beside the logits stage's -inf
mask; end to end through `difftest run --op prefill-indexer`."""

from __future__ import annotations

import dataclasses

import pytest

from difftest.backends import stages, vllm_ragged
from difftest.backends.stages import Composition
from difftest.cli import main
from difftest.core.kinds import ExitStatus, Headline, OperationKind
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.operation_run import Drawn, Named, run_one, run_operation
from difftest.generators.indexer import PrefillIndexerSpec, build_prefill_indexer_case
from difftest.generators.ragged import RaggedSpec, RaggedWindows
from difftest.operations import operation
from difftest.records.bundle import load_bundle
from difftest.records.serialize import load_results
from tests.planted_ragged import RELATIVE_CLEAN, Planted, in_form, logits_of

PREFILL = operation(OperationKind.PREFILL_INDEXER)
AITER_PINNED = "0.1.7.post2.dev18"
RIGHT = Planted("planted-right", "right")  # the oracle's logits rounded to float32, absolute
RIGHT_RELATIVE = Planted("planted-right-relative", "right", RELATIVE_CLEAN)


@dataclasses.dataclass
class OneShort(Planted):
    """Every window loses its last key (a `<` for `<=` on k_end): -inf inside the window, so the key is
    missing from every top-k that should take it."""

    def _one_short(self, inputs, out):
        ends = (inputs.k_end - 1).clamp(min=inputs.k_start)
        return in_form(inputs, logits_of(inputs, inputs.k_start, ends, inputs.width), inputs.k_start)


SHORT = OneShort("planted-window-one-short", "one_short")
COMPOSED = [Composition(p.name, "torch-topk") for p in (RIGHT, RIGHT_RELATIVE, SHORT)]


@pytest.fixture(autouse=True)
def planted(monkeypatch):
    """The planted ragged backends as built-in ones, each composed with torch-topk."""
    for backend in (RIGHT, RIGHT_RELATIVE, SHORT):
        monkeypatch.setitem(vllm_ragged.RAGGED_BACKENDS, backend.name, lambda backend=backend: backend)
    monkeypatch.setattr(stages, "PREFILL_COMPOSITIONS", (*stages.PREFILL_COMPOSITIONS, *COMPOSED))


def _case(k: int, seed: int = 0):
    """Chunked prefill: three requests past key 0, a causal staircase of windows both shorter and longer than k."""
    spec = RaggedSpec(name="px", rows=12, keys=160, heads=16, head_dim=32, windows=RaggedWindows.STAIRCASE,
                      requests=3)
    return build_prefill_indexer_case(PrefillIndexerSpec(spec, k), seed)


def _run(name: str, case) -> object:
    return run_one(PREFILL, Named(name, PREFILL.backends()[name]()), case, RunConfig())


@pytest.mark.parametrize("name", [c.name for c in COMPOSED[:2]])
def test_a_right_ragged_composition_passes_in_either_logits_form(name):
    for k, seed in ((1, 0), (8, 1), (200, 2)):  # 200: every window shorter than k
        result = _run(name, _case(k, seed))
        assert result.verdict == Verdict.PASS, result.headline
        assert result.selection.rows == 12 and not result.selection.wrong_rows


def test_a_logits_kernel_reading_the_wrong_window_shows_both_the_wrong_sets_and_the_mask_rows():
    result = _run(COMPOSED[2].name, _case(200))  # a top-k that takes every key of every window
    assert result.verdict == Verdict.FAIL_PADDING and result.operation == OperationKind.PREFILL_INDEXER
    assert result.selection.wrong_rows and result.selection.wrong_tokens >= len(result.selection.wrong_rows)
    assert result.comparison.mask_rows
    assert "rows select a wrong set" in result.headline and "rows with a wrong -inf mask" in result.headline


def test_run_operation_judges_a_right_and_a_planted_composition_side_by_side():
    named = [Named(c.name, PREFILL.backends()[c.name]()) for c in (COMPOSED[0], COMPOSED[2])]
    right, short = run_operation(PREFILL, named, [Drawn(_case(8, 3))], RunConfig())
    assert right.verdict == Verdict.PASS and short.verdict.failed
    assert short.selection.wrong_rows and short.comparison.mask_rows


def test_aiters_shifted_windows_cost_the_prefill_step_their_first_keys():
    """AITER's pinned Triton ragged kernel (docs/findings/aiter-triton-ragged-window.md), composed as vLLM's ROCm
    prefill composes it, with the torch top-k, under the interpreter: a window shorter than k that starts off the
    128-key tile loses its first start % 128 keys from the selected set; windows starting on the tile keep all."""
    name = "aiter-triton-ragged+torch-topk"
    backend = PREFILL.backends()[name]()
    if (reason := backend.unavailable_reason("cpu")) or AITER_PINNED not in backend.contract.library:
        pytest.skip(f"{name}: needs amd-aiter {AITER_PINNED} (make installs it): {reason or backend.contract.library}")
    spec = RaggedSpec(name="aligned-and-not", rows=4, keys=200, heads=16, head_dim=32, starts=(0, 3, 130, 128),
                      ends=(40, 43, 170, 168))
    result = _run(name, build_prefill_indexer_case(PrefillIndexerSpec(spec, 64), 0))
    assert result.verdict == Verdict.FAIL_PADDING, result.headline
    assert result.selection.wrong_rows == (1, 2) and result.selection.wrong_tokens == 3 + 2, result.headline
    assert result.comparison.mask_rows == [1, 2]


def test_compositions_are_data_naming_ragged_and_top_k_backends():
    for composition in stages.PREFILL_COMPOSITIONS:
        assert composition.logits in stages.ragged_backends() and composition.topk in stages.topk_backends()
        assert composition.name in PREFILL.backends()
    assert PREFILL.headlines == (Headline.SELECTION, Headline.MASK)


def test_prefill_indexer_cases_and_specs_read_back_as_written(tmp_path):
    case = _case(8)
    back = type(case).load(case.save(tmp_path / "c.npz"))
    assert back.k == 8 and back.name == case.name and back.logits.k_end.equal(case.logits.k_end)
    spec = PrefillIndexerSpec(RaggedSpec(name="x"), 16)
    assert PrefillIndexerSpec.from_json(spec.to_json()) == spec
    assert dataclasses.replace(spec, k=4).k == 4


def test_run_op_prefill_indexer_catches_the_planted_composition_bundles_replays_and_shrinks_it(tmp_path, capsys):
    report, repro = tmp_path / "r.json", tmp_path / "repro"
    right, wrong = COMPOSED[0].name, COMPOSED[2].name
    code = main(["run", "--op", "prefill-indexer", "--cases", "random", "--backends", f"{right},{wrong}",
                 "--report", str(report), "--repro-dir", str(repro)])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED and "wrong set (tokens)" in out and "-inf-mask mismatch" in out
    results = load_results(report)
    assert {r.verdict for r in results if r.backend == right} == {Verdict.PASS}
    assert any(r.verdict.failed for r in results if r.backend == wrong)
    bundle = next(p for p in sorted(repro.iterdir()) if (p / "bundle.json").exists())
    assert load_bundle(bundle).operation == OperationKind.PREFILL_INDEXER
    assert main(["replay", str(bundle)]) == ExitStatus.FAILED
    assert main(["shrink", str(bundle), "--seconds", "5", "--out", str(tmp_path / "small")]) == ExitStatus.OK
    small = load_bundle(next((tmp_path / "small").iterdir()))
    original = load_bundle(bundle).case
    assert small.verdict.failed and (small.case.rows, small.case.k) <= (original.rows, original.k)
