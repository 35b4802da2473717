"""`[tool.difftest]` in the current project's pyproject.toml: defaults for `difftest run`'s options,
validated by difftest.core.schema, overridden by the options given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difftest.core.kinds import ExitStatus
from tests.support import REPO_ROOT, run_cli

DEFAULTS = """\
[project]
name = "my-kernels"

[tool.difftest]
backends = ["torch"]
cases = "edges"
case-filter = ["length-one-*"]
report = "out/r.json"
quiet = true
isolate = false
next-n = [1, 2]

[tool.difftest.matrix]  # difftest matrix's own table: left to it
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A project folder (the working folder) whose pyproject.toml has DEFAULTS; a subfolder works too."""
    (tmp_path / "pyproject.toml").write_text(DEFAULTS)
    (tmp_path / "src").mkdir()
    monkeypatch.chdir(tmp_path / "src")
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # tests.user_backends below
    return tmp_path


def test_the_defaults_apply_and_the_report_shows_them_as_options(project):
    code, out, err = run_cli(["run", "--no-progress"])
    assert code == ExitStatus.OK and out == "PASS: 2 results: torch PASS\n" and err == "", f"{out=} {err=}"
    run = json.loads((project / "src" / "out" / "r.json").read_text())["run"]
    assert run["command"] == ("difftest run --backends=torch --cases=edges --next-n=1,2 --report=out/r.json --quiet "
                              "'--case-filter=length-one-*' --no-isolate --no-progress"), run["command"]


def test_options_given_override_their_defaults(project):
    argv = ["run", "--no-progress", "--case-filter", "all-padding-*", "--verbose", "--report", "other.json",
            "--backend-module", "tests.user_backends:DeclaresCudaOnly"]
    code, out, err = run_cli(argv)
    results = json.loads((project / "src" / "other.json").read_text())["results"]
    assert {r["case"] for r in results} == {"all-padding-mtp1-s0", "all-padding-mtp2-s1000"}, "replaced, not added to"
    assert "torch on all-padding-mtp1-s0 [" in out and "cuda-only" in err, f"{out=}"  # verbose, not quiet
    assert code == ExitStatus.FAILED and not (project / "src" / "out").exists()


@pytest.mark.parametrize(("table", "message"), [
    ('device = "gpu"', "[tool.difftest] device='gpu': expected one of ['cpu', 'cuda']"),
    ("backend = ['torch']", "[tool.difftest] keys=['backend']: expected `difftest run` options among ['backend-"),
    ('backends = "torch"', "[tool.difftest] backends='torch': expected a list of names"),
    ('count = "3"', "[tool.difftest] count='3': expected an integer"),
    ("quiet = 1", "[tool.difftest] quiet=1: expected true or false"),
    ("next-n = [1, 'x']", "[tool.difftest] next-n[1]='x': expected an integer"),
])
def test_a_table_that_does_not_fit_is_one_line_exit_2(project, table, message):
    (project / "pyproject.toml").write_text(f"[tool.difftest]\n{table}\n")
    code, out, err = run_cli(["run", "--no-progress"])
    assert code == ExitStatus.USAGE and err.count("\n") == 1 and out == "", err
    assert err.startswith(f"difftest: error: {project / 'pyproject.toml'} {message}"), err


def test_a_pyproject_that_is_not_toml_is_one_line_exit_2(project):
    (project / "pyproject.toml").write_text("[tool.difftest\n")
    code, _, err = run_cli(["run", "--no-progress"])
    assert code == ExitStatus.USAGE and err.startswith(f"difftest: error: pyproject='{project / 'pyproject.toml'}': "
                                                       "expected a pyproject.toml in valid TOML"), err
