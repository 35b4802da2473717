"""The matrix file and its plan: schema errors as one line and exit 2, cells, and every exclusion's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.core.hardware import DeviceKind
from difftest.core.kinds import ExitStatus
from difftest.matrix.cell import plan_matrix
from difftest.matrix.definition import Why, load_matrix
from tests.support import run_cli

PLANTED = "tests.planted:block_boundary_off_by_one"  # its contract: devices ('cpu',)
GOOD = f"""
[matrix]
backends = ["torch", "deepgemm", "{PLANTED}"]

[matrix.devices.cpu]
runner = "ubuntu-latest"

[matrix.devices.sm90]
runner = ["self-hosted", "h200"]

[matrix.devices.gfx942]
runner = "mi300x"

[matrix.versions.installed]
backends = ["torch", "tests.*"]

[matrix.versions."vllm-0.33.0"]
wheel = "vllm==0.33.0"
backends = ["deepgemm*"]

[matrix.suites.quick]
budget = 60

[matrix.suites.full]

[[matrix.exclude]]
suite = "full"
reason = "the full suite costs GPU hours"

[[matrix.include]]
device = "sm90"
"""


def _write(tmp_path: Path, text: str, name: str = "difftest.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_plan_lists_cells_and_why_each_combination_is_left_out(tmp_path):
    plan = plan_matrix(load_matrix(_write(tmp_path, GOOD)))
    cells = {cell.name: cell.backends for cell in plan.cells}
    assert cells == {"cpu/installed/quick": ("torch", PLANTED), "sm90/installed/quick": ("torch",),
                     "sm90/installed/full": ("torch",), "sm90/vllm-0.33.0/quick": ("deepgemm",),
                     "sm90/vllm-0.33.0/full": ("deepgemm",), "gfx942/installed/quick": ("torch",)}, f"{cells=}"
    why = {(e.device, e.backend, e.version, e.suites): (e.why, e.reason) for e in plan.excluded}
    assert why[DeviceKind.SM90, PLANTED, "installed", ()] == (
        Why.ARCH, "contract devices ['cpu'] exclude cuda"), f"{why=}"
    assert why[DeviceKind.GFX942, "deepgemm", "vllm-0.33.0", ()] == (
        Why.ARCH, "contract archs ['sm90'] exclude gfx942"), f"{why=}"
    assert why[DeviceKind.SM90, "deepgemm", "installed", ()][0] == Why.VERSION, f"{why=}"
    assert why[DeviceKind.CPU, "torch", "installed", ("full",)] == (Why.RULE, "the full suite costs GPU hours")
    assert not any(e.device == DeviceKind.SM90 and e.why == Why.RULE for e in plan.excluded), "include sm90 wins"


def test_plan_command_prints_cells_and_reasons(tmp_path):
    code, out, err = run_cli(["matrix", "plan", "--file", str(_write(tmp_path, GOOD))])
    assert code == ExitStatus.OK, f"{code=} {err=}"
    assert "6 cells" in out and "cpu/installed/quick" in out, out
    assert "sm90,gfx942/installed tests.planted:block_boundary_off_by_one (every suite): arch unsupported" in out, out
    assert "cpu,gfx942/installed torch (full): excluded: the full suite costs GPU hours" in out, out


def test_pyproject_table_is_read(tmp_path):
    text = GOOD.replace("[matrix", "[tool.difftest.matrix")
    plan = plan_matrix(load_matrix(_write(tmp_path, text, "pyproject.toml")))
    assert len(plan.cells) == 6, plan.render()


BAD = [
    ('[matrix.devices.sm91]\nrunner = "x"', "matrix.devices key 'sm91'='sm91': expected one of ['cpu', 'sm90'"),
    ('[matrix.devices.cpu]\nrunner = "x"\ngpu = "H200"', "matrix.devices['cpu']=['gpu']: expected fields among"),
    ('[matrix.versions.v]\nwheel = "vllm>=0.33"', "matrix.versions['v'].wheel='vllm>=0.33': expected a pinned"),
    ('[matrix.versions.v]\nwheel = "vllm==1"\npath = "x"', "matrix.versions['v'].path='x': expected no path beside"),
    ('[[matrix.exclude]]\ndevice = "cpu"', "matrix.exclude[0].reason=None: expected a non-empty string"),
    ('[matrix.suites.fz]\nfuzz = true', "matrix.suites['fz'].budget=None: expected a number of seconds"),
    ('[matrix.suites.s]\nspec = { next_n = 0 }', "matrix.suites['s'].spec.next_n=0: expected an integer in [1, 16]"),
    ('[matrix.suites.s]\nbudget = -1', "matrix.suites['s'].budget=-1: expected a number in [1.0, 604800]"),
    ('[matrix.suites.s]\nname = "t"', "matrix.suites['s']=['name']: expected fields among ['budget', 'case_filter', "
     "'cases', 'count', 'fuzz', 'isolate', 'op', 'seed', 'selftest', 'spec']"),  # a suite's name is its table's
    ('[matrix.difftest]\nversion = ">=0.1"', "matrix.difftest.version='>=0.1': expected a difftest release"),
    ('[matrix.difftest]\nversion = "0.1.0"\nwheel = "d.whl"', "matrix.difftest.wheel='d.whl': expected nothing "
     "beside version"),
    ('[matrix.difftest]\nref = "main"', "matrix.difftest.ref='main': expected a ref only beside a git URL"),
    ('[matrix.difftest]\ngit = "https://h/d.git; rm -rf ~"', "matrix.difftest.git='https://h/d.git; rm -rf ~': "
     "expected a git URL"),
    ('[matrix.difftest]\nwheel = "dist/difftest.tar.gz"', "matrix.difftest.wheel='dist/difftest.tar.gz': expected "
     "a wheel file"),
]


@pytest.mark.parametrize(("extra", "expected"), BAD, ids=[b[1].split("=")[0] for b in BAD])
def test_a_bad_matrix_file_is_one_line_and_exit_2(tmp_path, extra, expected):
    base = '[matrix]\nbackends = ["torch"]\n[matrix.devices.cpu]\nrunner = "u"\n[matrix.suites.quick]\n'
    text = base.replace('[matrix.devices.cpu]\nrunner = "u"\n', "") if "devices" in extra else base
    path = _write(tmp_path, text + extra + "\n")
    code, out, err = run_cli(["matrix", "plan", "--file", str(path)])
    assert code == ExitStatus.USAGE, f"{code=} {out=} {err=}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"difftest: error: {path} {expected}"), f"{err=}"


def test_unreadable_toml_and_a_missing_table_are_one_line(tmp_path):
    code, _, err = run_cli(["matrix", "plan", "--file", str(_write(tmp_path, "[matrix\n"))])
    assert code == ExitStatus.USAGE and err.count("\n") == 1 and "valid TOML" in err, f"{err=}"
    code, _, err = run_cli(["matrix", "plan", "--file", str(_write(tmp_path, "[other]\n"))])
    assert code == ExitStatus.USAGE and "matrix=None: expected a [matrix] table" in err, f"{err=}"


def test_an_unknown_cell_names_the_cells(tmp_path):
    code, _, err = run_cli(["matrix", "run", "cpu/nope/quick", "--file", str(_write(tmp_path, GOOD))])
    assert code == ExitStatus.USAGE and "CELL='cpu/nope/quick': expected a cell of" in err, f"{err=}"
    assert "'cpu/installed/quick'" in err, f"{err=}"


def _one_cell(tmp_path: Path, device: str, version: str = "") -> Path:
    return _write(tmp_path, f'[matrix]\nbackends = ["torch"]\n[matrix.devices.{device}]\nrunner = "u"\n{version}'
                            "[matrix.suites.q]\n")


def test_a_wheel_version_that_is_not_the_installed_one_is_one_line(tmp_path):
    path = _one_cell(tmp_path, "cpu", '[matrix.versions.v]\nwheel = "difftest-no-such-dist==1.0"\n')
    code, _, err = run_cli(["matrix", "run", "cpu/v/q", "--file", str(path), "--out", str(tmp_path / "o")])
    assert code == ExitStatus.USAGE and err.count("\n") == 1, err
    assert f"{path} matrix.versions.v.wheel='difftest-no-such-dist==1.0': expected the installed distribution " \
        "(difftest-no-such-dist is not installed; pip install 'difftest-no-such-dist==1.0' first)" in err, err


def test_a_gpu_cell_on_another_machine_is_refused(tmp_path):
    code, _, err = run_cli(["matrix", "run", "sm90/installed/q", "--file", str(_one_cell(tmp_path, "sm90")),
                            "--out", str(tmp_path / "o")])
    assert code == ExitStatus.USAGE and "CELL='sm90/installed/q': expected a sm90 GPU" in err, err
