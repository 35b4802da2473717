"""Hostile --resume files (issue 41, item 3): what --resume names is read back as a report or a stream, so a
symbolic link (to a secret, to anything) is refused, and a file that is neither is refused without quoting it:
a secret would otherwise reach the terminal, and a CI log, in the error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difftest.core.kinds import ExitStatus
from tests.support import run_cli

RUN = ["run", "--no-progress", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]
SECRET = "token=hunter2-what-the-file-holds"


def _one_line(code: int, err: str, want: ExitStatus) -> str:
    lines = err.strip().splitlines()
    assert code == want and len(lines) == 1 and "Traceback" not in err, f"{code=} {err=}"
    return lines[0]


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    """The stream of a finished run: what --resume takes."""
    path = tmp_path_factory.mktemp("earlier") / "s.jsonl"
    code, _, err = run_cli([*RUN, "--stream", str(path)])
    assert code == ExitStatus.OK, err
    return path


def _secret(folder: Path) -> Path:
    path = folder / "secret.txt"
    path.write_text(SECRET + "\n")
    return path


@pytest.mark.parametrize("target", ["a-secret", "a-real-stream"])
def test_a_resume_file_that_is_a_symbolic_link_is_refused_without_quoting_what_it_points_at(stream, tmp_path,
                                                                                            target):
    link = tmp_path / "linked.jsonl"
    link.symlink_to(_secret(tmp_path) if target == "a-secret" else stream)
    code, out, err = run_cli([*RUN, "--resume", str(link)])
    line = _one_line(code, err, ExitStatus.USAGE)
    assert line.startswith(f"difftest: error: --resume='{link}'") and "not a symbolic link" in line, line
    assert "hunter2" not in out + err


@pytest.mark.parametrize("holds", [
    SECRET,  # no JSON at all
    json.dumps({"password": SECRET}),  # one JSON object, no report
    json.dumps({"password": SECRET}) + "\n" + json.dumps({"run": {}}),  # JSONL whose first line is no record
    json.dumps(["a", SECRET]),  # JSON, neither
])
def test_a_resume_file_that_is_no_report_or_stream_is_refused_without_quoting_it(tmp_path, holds):
    path = tmp_path / "other.json"
    path.write_text(holds + "\n")
    code, _, err = run_cli([*RUN, "--resume", str(path)])
    line = _one_line(code, err, ExitStatus.USAGE)
    assert line.startswith(f"difftest: error: --resume='{path}': expected a JSON report") and "hunter2" not in line, \
        line
