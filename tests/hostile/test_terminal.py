"""Terminal escapes (issue 29's red-team pass): a case name from a bundle (or a spec) reached the terminal
raw in replay and in failure blocks. What difftest prints has every control character escaped."""

from __future__ import annotations

import contextlib
import io
import json

from difftest.backends import as_loaded
from difftest.cli import main
from difftest.core.kinds import ExitStatus
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_one
from difftest.generators import CaseSpec, build_case
from difftest.records.bundle import write_bundle
from tests import planted
from tests.support import run_cli

# Clear the screen, retitle the window, recolour, overwrite the line, and reverse the text that follows.
HOSTILE = "ev\x1b[2J\x1b]0;owned\x07\x1b[31mil\r\u202e"
ESCAPED = "ev\\x1b[2J\\x1b]0;owned\\x07\\x1b[31mil\\r\\u202e"
MODULE = "tests.planted:block_boundary_off_by_one"


def _clean(text: str) -> None:
    assert all(ch.isprintable() or ch in "\n" for ch in text), f"a control character reached the terminal: {text!r}"


def test_a_hostile_case_name_is_escaped_in_replay(tmp_path):
    case = build_case(CaseSpec(name=HOSTILE, lengths=(16,), heads=4, head_dim=16), 0)
    loaded = as_loaded(planted.block_boundary_off_by_one)
    folder = write_bundle(tmp_path, case, run_one(loaded, case, RunConfig()), RunConfig(), loaded.origin)
    code, out, err = run_cli(["replay", str(folder), "--backends", MODULE])
    assert code == ExitStatus.FAILED, err
    _clean(out + err)
    assert f"on {ESCAPED}-s0 [" in out, out  # the header and the failure block name it, escaped


def test_a_hostile_case_name_is_escaped_in_run_failure_blocks():
    spec = json.dumps({"name": HOSTILE, "lengths": [16], "heads": 4, "head_dim": 16})
    code, out, err = run_cli(["run", "--no-progress", "--backend-module", MODULE, "--spec", spec])
    assert code == ExitStatus.FAILED, err
    _clean(out + err)
    assert f"planted-block-boundary on {ESCAPED}-s0 [" in out, out


def test_printable_keeps_text_and_layout_and_escapes_the_rest():
    from difftest.core.text import printable  # the one helper every printed line goes through

    assert printable("row 3:\n\tlé ✓ ½") == "row 3:\n\tlé ✓ ½"
    assert printable(HOSTILE) == ESCAPED
    assert printable("a\nb\tc", lines=False) == "a\\nb\\tc"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_fuzz_progress_line_redraws_itself_on_a_terminal():
    """The campaign's bar went through the escaping stream: each redraw printed a literal `\\r` and the line
    grew across the terminal instead of being drawn over."""
    err = _Terminal()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        main(["fuzz", "--budget", "1s", "--backends", "torch"])
    drawn = err.getvalue()
    assert "fuzz " in drawn and "\r" in drawn and "\\r" not in drawn, f"{drawn=}"
