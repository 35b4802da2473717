"""docs/device-runs.md and scripts/device_visit.sh agree: every step of the driver's table has its function
and its row on the page, and a step that is not in the table is refused before anything runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "scripts" / "device_visit.sh"
PAGE = ROOT / "docs" / "device-runs.md"


def _driver(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(DRIVER), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)


def _steps() -> list[str]:
    """The step names `--list` prints, its header line left out."""
    listed = _driver("--list")
    assert listed.returncode == 0, listed.stderr
    return [line.split()[0] for line in listed.stdout.splitlines()[1:]]


def test_every_step_has_its_function_and_its_row_on_the_page():
    steps, script, page = _steps(), DRIVER.read_text(), PAGE.read_text()
    assert len(steps) > 20, "the driver lists its steps"
    no_function = [s for s in steps if not re.search(rf"^step_{s.replace('-', '_')}\(\) {{", script, re.MULTILINE)]
    no_row = [s for s in steps if f"| `{s}` |" not in page]
    assert not no_function, f"steps without a step_ function in scripts/device_visit.sh: {no_function}"
    assert not no_row, f"steps docs/device-runs.md has no row for: {no_row}"


def test_a_step_outside_the_table_is_refused_in_one_line_before_anything_runs(tmp_path: Path):
    out = tmp_path / "out"
    done = _driver("production", "no-such-step", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "step 'no-such-step': expected one of: production suite" in done.stderr
    assert not out.exists(), "nothing ran: no step's folder was made"


def test_without_an_outdir_it_prints_its_usage_and_exits_2():
    done = _driver("production")
    assert done.returncode == 2 and done.stderr.startswith("usage: bash scripts/device_visit.sh STEP [STEP ...] OUTDIR")
