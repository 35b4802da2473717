"""A kernel engineer's own top-k, ragged logits and composed indexer kernels through every door of the command
line, with no edit to difftest: a module written in a temporary folder (the working folder, outside the package),
each kernel with a planted bug, each caught with its verdict by `run`, `fuzz` (ended by --until-failures, not by
time), replayed from its bundle (only with --trust-bundle), shrunk to a smaller case, in a worker process under
--isolate, and the template of `selftest --backend-template`."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from difftest.cli import main
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.records.bundle import load_bundle
from difftest.records.serialize import load_results

MODULE = "engineer_kernels"
KERNELS = textwrap.dedent('''
    """A kernel engineer's kernels, each with a planted bug."""
    import math

    import torch

    import difftest
    from difftest.core.kinds import IndexConvention, LogitsForm, MaskConvention, NanRanking, TopkPadding, WindowForm
    from difftest.core.ragged import RaggedContract
    from difftest.core.topk import TopkContract

    TOPK = TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_CANDIDATES,
                        window=WindowForm.STARTS_LENGTHS, nan=NanRanking.HIGHEST)


    def right_topk(logits, k, row_starts, lengths, shift=0):
        rows, width = logits.shape
        starts = row_starts.long()[:, None]
        columns = torch.arange(width, device=logits.device)[None, :]
        inside = (columns >= starts) & (columns < starts + lengths.long()[:, None])
        values, picked = torch.topk(logits.masked_fill(~inside, -math.inf), min(k, width), dim=-1)
        indices = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
        indices[:, :values.shape[1]] = (picked - starts + shift).to(torch.int32).masked_fill(values == -math.inf, -1)
        return indices


    @difftest.backend(TOPK, name="my-topk")
    def my_topk(logits, k, row_starts, lengths):
        indices = right_topk(logits, k, row_starts, lengths)
        indices[lengths.long() > k, 0] = -1  # planted: a window wider than k loses its largest value
        return indices


    @difftest.backend(TOPK, name="off-by-one-topk")
    def off_by_one_topk(logits, k, row_starts, lengths):
        return right_topk(logits, k, row_starts, lengths, shift=1)  # planted: every index one column on


    @difftest.backend(RaggedContract(form=LogitsForm.ABSOLUTE, mask=MaskConvention.TAIL_NEG_INF), name="my-ragged")
    def my_ragged(q, k, k_scale, weights, k_start, k_end):
        scores = torch.einsum("rhd,pd->rhp", q.float(), k.float()).relu()
        logits = torch.einsum("rh,rhp->rp", weights, scores) * k_scale[None, :]
        columns = torch.arange(k.shape[0], device=q.device)[None, :]
        inside = (columns >= k_start.long()[:, None]) & (columns < k_end.long()[:, None] - 1)  # planted: one short
        return logits.masked_fill(~inside, -math.inf)
''')


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """The kernel module in a folder of its own, the working folder of the commands (as `python -m difftest` run
    there), imported afresh by each test."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(KERNELS)
    monkeypatch.chdir(folder)
    yield folder
    sys.modules.pop(MODULE, None)


def _bundles(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if (p / "bundle.json").exists())


def _failures(report: Path, backend: str) -> set[Verdict]:
    return {r.verdict for r in load_results(report) if r.backend == backend and r.verdict.failed}


def _size(case: object) -> int:
    """How big a case is: the elements of every tensor it holds (an indexer case: its logits stage's too) and its
    integer sizes (k, width)."""
    if isinstance(case, torch.Tensor):
        return case.numel()
    if dataclasses.is_dataclass(case):
        return sum(_size(getattr(case, f.name)) for f in dataclasses.fields(case))
    return case if isinstance(case, int) and not isinstance(case, bool) else 0


# (--op, the backend options, the name its results carry, the verdict its planted bug earns)
USER_BACKENDS = [
    ("topk", ["--backends", f"{MODULE}:my_topk"], "my-topk", Verdict.FAIL_PADDING),
    ("ragged-logits", ["--backend-module", f"{MODULE}:my_ragged"], "my-ragged", Verdict.FAIL_MASK),
    ("indexer", ["--backends", f"torch+{MODULE}:off_by_one_topk"], "torch+off-by-one-topk",
     Verdict.FAIL_OUT_OF_WINDOW),
    ("prefill-indexer", ["--backends", f"{MODULE}:my_ragged+torch-topk"], "my-ragged+torch-topk", Verdict.FAIL_MASK),
    ("prefill-indexer", ["--backend-module", f"{MODULE}:my_ragged", "--backend-module", f"{MODULE}:off_by_one_topk",
                         "--backends", "my-ragged+off-by-one-topk"], "my-ragged+off-by-one-topk", Verdict.FAIL_MISSING),
]


@pytest.mark.parametrize(("op", "chosen", "name", "verdict"), USER_BACKENDS, ids=[b[2] for b in USER_BACKENDS])
def test_a_user_kernel_is_caught_by_run_and_replayed_and_shrunk_from_its_bundle(kernels, capsys, op, chosen, name,
                                                                               verdict):
    report, repro = kernels / "r.json", kernels / "repro"
    assert main(["run", "--op", op, *chosen, "--cases", "random", "--report", str(report), "--repro-dir",
                 str(repro)]) == ExitStatus.FAILED
    assert verdict in _failures(report, name) and {r.backend for r in load_results(report)} == {name}
    bundle = next(b for b in _bundles(repro) if load_bundle(b).verdict == verdict)
    assert load_bundle(bundle).origin.target is not None and not load_bundle(bundle).origin.registered
    capsys.readouterr()
    for command in (["replay", str(bundle)], ["shrink", str(bundle), "--seconds", "5"]):
        assert main(command) == ExitStatus.USAGE  # a bundle naming a module imports it only when trusted
        assert "which replay does not import unless trusted" in capsys.readouterr().err
    assert main(["replay", str(bundle), "--trust-bundle"]) == ExitStatus.FAILED
    assert f"verdict: {verdict.value} (the same as recorded" in capsys.readouterr().out
    small = kernels / "small"
    assert main(["shrink", str(bundle), "--trust-bundle", "--seconds", "10", "--out", str(small)]) == ExitStatus.OK
    shrunk = load_bundle(_bundles(small)[0])
    assert shrunk.verdict == verdict and shrunk.origin == load_bundle(bundle).origin
    assert _size(shrunk.case) < _size(load_bundle(bundle).case)


@pytest.mark.parametrize(("op", "chosen", "name", "verdict"), [USER_BACKENDS[i] for i in (0, 1, 2)],
                         ids=[USER_BACKENDS[i][2] for i in (0, 1, 2)])
def test_a_campaign_stops_at_the_user_kernels_first_failure_and_bundles_it(kernels, op, chosen, name, verdict):
    report, repro = kernels / "f.json", kernels / "repro"
    assert main(["fuzz", "--op", op, *chosen, "--budget", "30m", "--until-failures", "1", "--report", str(report),
                 "--repro-dir", str(repro)]) == ExitStatus.FAILED
    failed = [r for r in load_results(report) if r.verdict.failed]
    assert len(failed) == 1 and failed[0].backend == name
    assert load_bundle(_bundles(repro)[0]).verdict == failed[0].verdict


def test_an_isolated_run_rebuilds_the_user_kernel_in_its_worker_from_its_module_path(kernels):
    report = kernels / "r.json"
    assert main(["run", "--op", "topk", "--backends", f"{MODULE}:my_topk", "--cases", "random", "--isolate",
                 "--report", str(report)]) == ExitStatus.FAILED
    results = load_results(report)
    assert {r.isolation.value for r in results} == {"worker"} and _failures(report, "my-topk") == {Verdict.FAIL_PADDING}


def test_a_kernel_of_another_operation_is_one_line_saying_which_it_is(kernels, capsys):
    assert main(["run", "--op", "topk", "--backends", f"{MODULE}:my_ragged"]) == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{MODULE}:my_ragged is a backend of the ragged-logits operation" in err
    assert main(["run", "--op", "indexer", "--backends", f"{MODULE}:my_topk+torch-topk"]) == ExitStatus.USAGE
    assert "is a backend of the topk operation" in capsys.readouterr().err


@pytest.mark.parametrize(("template", "mutants", "envelope"), [
    ("my_topk", "topk-correct,topk-absolute-indices", "difftest.backends.topk_mutants"),
    ("my_ragged", "ragged-correct,ragged-end-inclusive", "difftest.backends.ragged_mutants"),
])
def test_a_user_kernel_is_the_template_of_its_operations_mutants(kernels, capsys, template, mutants, envelope):
    report = kernels / "s.json"
    assert main(["selftest", "--backend-template", f"{MODULE}:{template}", "--mutants", mutants, "-q", "--report",
                 str(report)]) == ExitStatus.OK
    assert capsys.readouterr().out.startswith("mutation score: 1 of 1 mutants caught")
    score = json.loads(report.read_text())["selftest"]
    assert score["template"] == f"{MODULE}:{template}" and score["envelope"].startswith(envelope)
    assert "in the envelope of" in score["envelope"]
    assert main(["selftest", "--backend-template", f"{MODULE}:{template}", "--mutants", "correct"]) \
        == ExitStatus.USAGE  # a paged mutant: not of the template's operation
    assert "--mutants='correct': expected mutants of the" in capsys.readouterr().err
