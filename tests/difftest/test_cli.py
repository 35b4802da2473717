"""The CLI in-process: exit codes, the table, one-line usage errors, the JSON report, user modules."""

from __future__ import annotations

import json
import re

import pytest

from difftest.cli import main
from difftest.core.kinds import ExitStatus

SMALL = ["--no-progress", "--count", "1", "--max-model-len", "48", "--heads", "4", "--head-dim", "16"]


def _usage_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == ExitStatus.USAGE, f"{argv=}: {code=}\n{out=}\n{err=}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("difftest: error: "), f"{argv=}: {err=}"
    assert "Traceback" not in err + out, f"{argv=}: {err=}"
    return lines[0]


def test_run_edges_with_torch_passes_and_prints_the_table(capsys):
    code = main(["run", "--backends", "torch", "--cases", "edges", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == ExitStatus.OK, f"{code=}\n{out}\n{err}"
    header, *rows = out.strip().splitlines()
    assert header.split()[:3] == ["backend", "cases", "rows"], f"{header=}"
    (torch_row,) = [r for r in rows if r.startswith("torch ")]
    assert re.search(r"\b0/\d+\b", torch_row) and "PASS" in torch_row, f"{torch_row=}"


def test_unknown_backend_is_one_line_exit_2(capsys):
    line = _usage_error(capsys, ["run", "--backends", "nope", "--no-progress"])
    assert "--backends='nope'" in line and "torch" in line, f"{line=}"


@pytest.mark.parametrize("option, value", [("--encoding", "bogus"), ("--layout", "sideways")])
def test_unknown_encoding_or_layout_is_exit_2(capsys, option, value):
    line = _usage_error(capsys, ["run", "--backends", "torch", option, value, *SMALL])
    assert f"{option}={value!r}" in line and "expected one of" in line, f"{line=}"


def test_bad_cases_is_exit_2(capsys):
    line = _usage_error(capsys, ["run", "--backends", "torch", "--cases", "most", *SMALL])
    assert "--cases='most'" in line and "'edges'" in line, f"{line=}"


def test_bad_device_is_exit_2(capsys):
    line = _usage_error(capsys, ["run", "--backends", "torch", "--device", "tpu", *SMALL])
    assert "--device='tpu'" in line, f"{line=}"


def test_bad_backend_module_is_exit_2(capsys):
    line = _usage_error(capsys, ["run", "--backends", "torch", "--backend-module",
                                 "tests.user_backends:logits_with_limits", *SMALL])
    assert "--backends='tests.user_backends:logits_with_limits'" in line, f"{line=}"


def test_argparse_errors_exit_2(capsys):
    assert main(["run", "--next-n", "one,two"]) == ExitStatus.USAGE
    assert "expected comma-separated integers" in capsys.readouterr().err


def test_backends_lists_torch_as_available(capsys):
    assert main(["backends"]) == ExitStatus.OK
    out = capsys.readouterr().out
    assert re.search(r"^  torch\s+available\b", out, re.MULTILINE), f"{out=}"  # indented under paged-logits:


def test_report_json_has_summaries_and_results(capsys, tmp_path):
    path = tmp_path / "nested" / "report.json"
    code = main(["run", "--backends", "torch", "--cases", "random", "--report", str(path), "--seed", "3", *SMALL])
    out = capsys.readouterr().out
    assert code == ExitStatus.OK and f"report: {path}" in out, f"{code=} {out=}"
    doc = json.loads(path.read_text())
    assert {"run", "summaries", "results"} <= set(doc), f"{set(doc)=}"
    (summary,) = doc["summaries"]
    assert summary["backend"] == "torch" and summary["verdict"] == "PASS" and summary["mask_rows"] == 0, f"{summary=}"
    assert len(doc["results"]) == summary["cases"] == 4, f"{len(doc['results'])=}"  # 4 random specs x --count 1
    first = doc["results"][0]
    assert first["verdict"] == "PASS" and first["comparison"]["mask_rows"] == [], f"{first=}"
    assert first["spec"]["max_model_len"] == 48 and first["spec"]["heads"] == 4, f"{first['spec']=}"
    assert doc["run"]["seed"] == 3 and doc["run"]["cases"] == 4, f"{doc['run']=}"


def test_wrong_user_backend_module_exits_1(capsys):
    code = main(["run", "--backends", "torch", "--backend-module", "tests.user_backends:sequence_length_for_every_row",
                 "--cases", "random", *SMALL])
    out = capsys.readouterr().out
    assert code == ExitStatus.FAILED, f"{code=}\n{out}"
    row = next(r for r in out.splitlines() if r.startswith("sequence_length_for_every_row "))
    assert "FAIL(mask)" in row, f"{row=}"
    assert "rows with the wrong -inf mask" in out and "first mismatch" in out, out
    torch_row = next(r for r in out.splitlines() if r.startswith("torch "))
    assert "PASS" in torch_row, f"{torch_row=}"


def test_encoding_override_reproduces_vllm_59420(capsys):
    """A correct per-sequence reader fails when handed the per-row table, and only then."""
    target = "tests.user_backends:per_sequence_reader"
    argv = ["run", "--backends", "torch", "--backend-module", target, "--cases", "random", "--next-n", "3", *SMALL]
    assert main(argv) == ExitStatus.OK, capsys.readouterr().out
    capsys.readouterr()
    assert main([*argv, "--encoding", "per-row"]) == ExitStatus.FAILED
    out = capsys.readouterr().out
    assert "overridden" in out and "FAIL(mask)" in out, out


def test_spec_option_redraws_exactly_the_named_case(capsys):
    """`--spec JSON --seed N` (the line difftest.workflows.checking prints) draws the one case {name}-s{N}."""
    spec = '{"name":"mtp2","next_n":2,"max_model_len":64,"lengths":[17,5]}'
    code = main(["run", "--backends", "torch", "--backend-module", "tests.user_backends:window_one_short",
                 "--spec", spec, "--seed", "41"])
    out = capsys.readouterr().out
    assert code == 1, f"{code=}\n{out}"
    assert "window-one-short on mtp2-s41 [B=2 next_n=2" in out, out
    assert "L=[17, 5]" in out and "mtp2-s42" not in out, out


def test_bad_spec_json_is_exit_2(capsys):
    line = _usage_error(capsys, ["run", "--backends", "torch", "--spec", "{not json"])
    assert line.startswith("difftest: error: --spec='{not json': expected a JSON object"), f"{line=}"
