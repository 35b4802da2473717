"""Hostile output paths (issue 29's red-team pass): a run writes regular files only. A device node, a
FIFO or a socket at an output path is refused before any case runs (as root, `--junit /dev/full`
replaced the device with a file), a symbolic link is written through (the file it points to is
replaced, the link stays), and a path that cannot even be looked at is one line, never a traceback.

Device nodes are made in the test's own folder (mknod, as root); never in /dev."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from difftest.core.errors import OutputError
from difftest.core.files import atomic_write
from difftest.core.kinds import ExitStatus
from tests.support import run_cli

RUN = ["run", "--no-progress", "--cases", "edges", "--case-filter", "length-one-*", "--backends", "torch"]
OUTPUTS = ["--report", "--junit", "--stream"]


def _one_line(code: int, err: str, want: ExitStatus) -> str:
    lines = err.strip().splitlines()
    assert code == want and len(lines) == 1 and "Traceback" not in err, f"{code=} {err=}"
    return lines[0]


def _device(folder: Path) -> Path:
    """A character device like /dev/full (1, 7) in `folder`; the test skips where mknod is not allowed."""
    path = folder / "full"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("mknod of a character device needs root (CAP_MKNOD); this test does not run as root")
    return path


def _fifo(folder: Path) -> Path:
    path = folder / "fifo"
    os.mkfifo(path)
    return path


def _socket(folder: Path) -> Path:
    path = folder / "sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.close()
    return path


@pytest.mark.parametrize("make, kind", [(_device, "a character device"), (_fifo, "a FIFO"), (_socket, "a socket")])
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_alone(tmp_path, make, kind):
    """`--junit /dev/full` (and `--report DEV --overwrite`) replaced the device with a regular file."""
    node = make(tmp_path)
    for option in OUTPUTS:
        code, _, err = run_cli([*RUN, option, str(node), "--overwrite"])
        line = _one_line(code, err, ExitStatus.IO)
        assert line == f"difftest: error: {option}='{node}': cannot write: {kind} is there (difftest writes " \
                       "regular files only)", line
        assert not stat.S_ISREG(os.lstat(node).st_mode), f"{option}: the {kind} was replaced by a file"
    with pytest.raises(OutputError, match=f"{kind} is there"):
        atomic_write(node, "x", "report")


def test_an_output_that_is_a_symbolic_link_is_written_through(tmp_path):
    """A link at the report path stays a link; the file it points to gets the report."""
    real = tmp_path / "real" / "report.json"
    real.parent.mkdir()
    link = tmp_path / "report.json"
    link.symlink_to(real)
    junit_real, junit_link = tmp_path / "real" / "junit.xml", tmp_path / "junit.xml"
    junit_link.symlink_to(junit_real)
    code, _, err = run_cli([*RUN, "--report", str(link), "--junit", str(junit_link)])
    assert code == ExitStatus.OK, err
    assert link.is_symlink() and junit_link.is_symlink(), "a link was replaced by a file"
    assert '"results"' in real.read_text() and "<testsuites" in junit_real.read_text()


def test_a_report_path_made_empty_beforehand_is_taken(tmp_path):
    """`REPORT=$(mktemp)` then `--report $REPORT` was refused as 'a path an earlier run wrote'."""
    fd, name = tempfile.mkstemp(dir=tmp_path, suffix=".json")
    os.close(fd)
    code, _, err = run_cli([*RUN, "--report", name])
    assert code == ExitStatus.OK, err
    assert '"results"' in Path(name).read_text()
    code, _, err = run_cli([*RUN, "--report", name])  # now an earlier run did write it
    assert "a path no earlier run wrote" in _one_line(code, err, ExitStatus.USAGE)


def test_a_file_name_too_long_is_exit_3_in_one_line(tmp_path):
    """A 300-character file name for --report, --stream or --junit was a traceback (exit 1)."""
    long = tmp_path / ("a" * 300)
    for option in OUTPUTS:
        code, _, err = run_cli([*RUN, option, str(long)])
        assert "File name too long" in _one_line(code, err, ExitStatus.IO), err


def test_an_empty_output_path_is_a_usage_error(tmp_path):
    """`--report ''` was a traceback (Path('') is the working folder, which has no name)."""
    for option in [*OUTPUTS, "--resume", "--repro-dir", "--ledger"]:
        code, _, err = run_cli([*RUN, option, ""])
        assert _one_line(code, err, ExitStatus.USAGE).startswith(f"difftest: error: {option}='': expected a path")
