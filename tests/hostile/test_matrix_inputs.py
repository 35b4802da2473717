"""Hostile inputs to `difftest matrix emit` and `merge` (issue 29's red-team list): each was a
traceback, a replaced link or a quadratic merge, and is one line, written through, or linear now.

The cell reports are real: one tiny case run by the torch backend and a planted mask bug, written as
`difftest matrix run` writes them, then given hostile names or multiplied as a long fuzz cell would.
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from pathlib import Path

import pytest

from difftest.backends import get_backends
from difftest.core.kinds import ExitStatus
from difftest.engine.config import RunConfig
from difftest.generators import CaseSpec, build_case
from difftest.matrix import merge
from difftest.records.report import write_json
from difftest.workflows.running import run
from tests.support import run_cli

MATRIX = ('[matrix]\nbackends = ["torch"]\n[matrix.devices.cpu]\nrunner = "ubuntu-latest"\n[matrix.suites.q]\n'
          '[matrix.difftest]\nversion = "0.1.0"\n')
SPEC = CaseSpec(lengths=(0, 1, 16, 17), next_n=2, heads=2, head_dim=16, block_size=16, max_model_len=32)
CELL = {"cell": "cpu/installed/tiny", "device": "cpu", "version": "installed", "library": "installed",
        "suite": "tiny"}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A matrix file of one CPU cell, as a path."""
    path = tmp_path_factory.mktemp("matrix") / "difftest.toml"
    path.write_text(MATRIX)
    return str(path)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A cell report as JSON: a PASS (torch) and a FAIL(mask) (the planted block-boundary bug)."""
    backends = get_backends(["torch", "tests.planted:block_boundary_off_by_one"])
    results = run(backends, [build_case(SPEC, seed=0)], RunConfig())
    path = write_json(tmp_path_factory.mktemp("cell") / "report.json", results, {"matrix": CELL})
    return json.loads(path.read_text())


def _cell_report(folder: Path, document: dict, cell: str = CELL["cell"]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    document = {**document, "run": {**document["run"], "matrix": {**CELL, "cell": cell}}}
    (folder / "report.json").write_text(json.dumps(document))
    return folder / "report.json"


def _renamed(document: dict, backend: str, case: str) -> dict:
    """The report with its failing result's backend and case renamed."""
    results = [dict(r, backend=backend, case=case) if r["verdict"] != "PASS" else r for r in document["results"]]
    return {**document, "results": results}


def _one_line_error(code: int, err: str, status: ExitStatus, starts: str) -> None:
    assert code == status and err.count("\n") == 1 and err.startswith(starts), f"{code=} {err=}"


# --------------------------------------------------------------------------- merge

def _calls(function, *args) -> int:
    """How many Python functions `function(*args)` calls, matplotlib's drawing left out (its work
    depends on the picture's grid, not on how many results are merged)."""
    count = 0

    def profile(frame, event, _arg):
        nonlocal count
        if event == "call" and "matplotlib" not in frame.f_code.co_filename:
            count += 1

    sys.setprofile(profile)
    try:
        function(*args)
    finally:
        sys.setprofile(None)
    return count


def _fuzz_cells(report: dict, folder: Path, results: int) -> list[Path]:
    """Two cells of `results` results each, as a fuzz campaign makes them: one case name per result,
    over two backends and two families."""
    paths = []
    for cell in ("cpu/installed/a", "cpu/installed/b"):
        made = [dict(report["results"][i % 2], case=f"random-s{i}") for i in range(results)]
        paths.append(_cell_report(folder / cell.replace("/", "_"), {**report, "results": made}, cell))
    return paths


def test_merging_costs_the_same_per_result_at_any_size(report, tmp_path):
    """Merging and writing n results makes O(n) calls: four times the results, four times the work
    (within 10 %). Every result is indexed once; nothing rescans what was merged before it (the JUnit
    suite recounted itself on every testcase added, the table rescanned all entries per backend)."""
    def merge_and_write(paths: list[Path], out: Path) -> None:
        merge.write_outputs(merge.merge(paths), out)

    merge_and_write(_fuzz_cells(report, tmp_path / "warm", 20), tmp_path / "warm-out")  # imports, caches
    small = _calls(merge_and_write, _fuzz_cells(report, tmp_path / "small", 150), tmp_path / "small-out")
    large = _calls(merge_and_write, _fuzz_cells(report, tmp_path / "large", 600), tmp_path / "large-out")
    assert large <= 4.4 * small, f"{small=} {large=}: {large / small:.1f}x the calls for 4x the results"


def test_the_summary_escapes_markdown_and_terminal_controls_from_the_reports(report, tmp_path):
    hostile = _renamed(report, backend="evil|*x*\x1b[31m", case="a\nb<img src=x>`c`_d_")
    path = _cell_report(tmp_path / "cell", hostile)
    code, out, err = run_cli(["matrix", "merge", "--out", str(tmp_path / "out"), str(path)])
    assert code == ExitStatus.FAILED, f"{code=} {err=}"
    summary = (tmp_path / "out" / "summary.md").read_text()
    for text in (summary, out):
        assert "\x1b" not in text and "a\nb" not in text and re.search(r"(?<!\\)<img", text) is None, text
    row = next(line for line in summary.splitlines() if line.startswith("| evil"))
    assert row.startswith("| evil\\|\\*x\\*\\\\x1b\\[31m @ installed (cpu) |"), row
    assert row.count(" | ") == 6, f"one row of 7 columns: {row}"
    assert "a\\\\nb\\<img src=x\\>\\`c\\`\\_d\\_" in summary, summary


def test_a_backend_named_like_mathtext_is_drawn_as_typed(report, tmp_path):
    path = _cell_report(tmp_path / "cell", _renamed(report, backend="$\\frac{$", case="$x^{$"))
    code, _, err = run_cli(["matrix", "merge", "--out", str(tmp_path / "out"), str(path)])
    assert code == ExitStatus.FAILED and err == "", f"{code=} {err=}"
    assert (tmp_path / "out" / "heatmap.png").read_bytes().startswith(b"\x89PNG")


def test_merge_out_an_existing_file_is_one_line(report, tmp_path):
    path = _cell_report(tmp_path / "cell", report)
    (tmp_path / "file").write_text("mine\n")
    code, _, err = run_cli(["matrix", "merge", "--out", str(tmp_path / "file"), str(path)])
    _one_line_error(code, err, ExitStatus.IO, "difftest: error: --out=")
    assert "a file is there" in err and (tmp_path / "file").read_text() == "mine\n", err


# --------------------------------------------------------------------------- emit -o

def test_emit_to_an_empty_path_is_one_line(matrix):
    code, _, err = run_cli(["matrix", "emit", "github", "--file", matrix, "-o", ""])
    _one_line_error(code, err, ExitStatus.USAGE, "difftest: error: --output='': expected a file path")


def test_emit_to_a_read_only_filesystem_is_status_3_in_one_line(matrix, monkeypatch, tmp_path):
    """Every call that would change the folder fails as on a read-only mount (EROFS), unlink included:
    cleaning up a temporary file there fails too, which was the traceback."""
    read_only = tmp_path / "ro"
    read_only.mkdir()

    def refused(call):
        def wrapped(path, *args, **kwargs):
            if str(path).startswith(str(read_only)) and (call is not os.open or args[0] & (os.O_WRONLY | os.O_RDWR)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return call(path, *args, **kwargs)
        return wrapped

    for name in ("open", "unlink", "mkdir", "rename", "replace"):
        monkeypatch.setattr(os, name, refused(getattr(os, name)))
    code, _, err = run_cli(["matrix", "emit", "github", "--file", matrix, "-o", str(read_only / "ci.yml")])
    _one_line_error(code, err, ExitStatus.IO, "difftest: error: --output=")
    assert "Read-only file system" in err, err


def test_emit_through_a_link_writes_its_target_and_keeps_the_link(matrix, tmp_path):
    target, link = tmp_path / "real.yml", tmp_path / "link.yml"
    target.write_text("old\n")
    link.symlink_to(target)
    code, _, err = run_cli(["matrix", "emit", "github", "--file", matrix, "-o", str(link)])
    assert code == ExitStatus.OK, f"{code=} {err=}"
    assert link.is_symlink() and os.readlink(link) == str(target), "the link is still a link, to the same file"
    assert target.read_text().startswith("# Generated by `difftest matrix emit github"), target.read_text()[:80]


def test_emit_to_a_device_is_refused_and_the_device_stays(matrix, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = run_cli(["matrix", "emit", "github", "--file", matrix, "-o", str(fifo)])
    _one_line_error(code, err, ExitStatus.IO, "difftest: error: --output=")
    assert "a FIFO is there" in err and fifo.is_fifo(), err


# --------------------------------------------------------------------------- operation suites

@pytest.mark.parametrize("op", ["topk", "ragged-logits", "indexer", "prefill-indexer"])
@pytest.mark.parametrize("table, field", [('spec = {lengths = [16]}', "spec"), ('case_filter = ["length-one-*"]',
                                                                                "case_filter")])
def test_an_operation_suite_with_a_paged_option_is_one_line(tmp_path, op, table, field):
    """A matrix `op` suite with a paged `spec` (or case filter) was taken, and the option silently ignored: its
    cells ran the operation's own plan."""
    path = tmp_path / "difftest.toml"
    path.write_text(MATRIX.replace("[matrix.suites.q]\n", f'[matrix.suites.q]\nop = "{op}"\n{table}\n'))
    code, _, err = run_cli(["matrix", "plan", "--file", str(path)])
    _one_line_error(code, err, ExitStatus.USAGE, "difftest: error: ")
    assert f"matrix.suites['q'].{field}=" in err, err
    assert f"expected a paged-logits suite (op = {op!r} runs its operation's own cases" in err, err
