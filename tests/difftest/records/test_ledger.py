"""`difftest run --ledger`: the ledger the pytest plugin reads, from the CLI. Ledgered failures are XFAIL
and leave the exit status alone; a pass that a strict entry covers fails the run; a bad file is exit 2."""

from __future__ import annotations

from pathlib import Path

from difftest.core.kinds import ExitStatus
from tests.support import run_cli

# One case that window_one_short (tests/user_backends.py) fails with FAIL(mask) and torch passes.
ONE_CASE = ["run", "--no-progress", "--backends", "torch", "--backend-module", "tests.user_backends:window_one_short",
            "--spec", '{"name":"mtp2","next_n":2,"max_model_len":64,"lengths":[17,5]}', "--seed", "41"]
ENTRY = """
[[divergence]]
backend = "{backend}"
verdict = "{verdict}"
spec = {{ next_n = {{ min = 2 }} }}
reason = "window one short"
issue = "example/kernels#7"
"""


def _ledger(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "known.toml"
    path.write_text(text)
    return ["--ledger", str(path)]


def test_a_ledgered_failure_is_xfail_and_the_run_passes(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, ENTRY.format(backend="window-one-*", verdict="FAIL(mask)"))
    code, out, _ = run_cli([*ONE_CASE, *ledger])
    assert code == ExitStatus.OK, out
    assert "XFAIL window-one-short on mtp2-s41: FAIL(mask), window one short (example/kernels#7)" in out, out


def test_junit_marks_a_ledgered_failure_as_a_known_divergence(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, ENTRY.format(backend="window-one-*", verdict="FAIL(mask)"))
    code, out, _ = run_cli([*ONE_CASE, *ledger, "--junit", str(tmp_path / "junit.xml")])
    xml = (tmp_path / "junit.xml").read_text()
    assert code == ExitStatus.OK and "known divergence: window one short (example/kernels#7)" in xml, out + xml


def test_a_failure_with_another_verdict_still_fails_the_run(tmp_path: Path) -> None:
    code, out, _ = run_cli([*ONE_CASE, *_ledger(tmp_path, ENTRY.format(backend="window-one-*", verdict="FAIL(nan)"))])
    assert code == ExitStatus.FAILED and "XFAIL" not in out, out


def test_a_pass_a_strict_entry_covers_fails_the_run(tmp_path: Path) -> None:
    text = ENTRY.format(backend="*", verdict="FAIL(mask)") + "strict = true\n"
    code, out, _ = run_cli([*ONE_CASE, *_ledger(tmp_path, text)])
    assert code == ExitStatus.FAILED, out
    assert "XPASS(strict) torch on mtp2-s41: ledger entry *::* FAIL(mask) (example/kernels#7) no longer diverges" \
        in out, out


def test_a_pass_a_loose_entry_covers_is_only_reported(tmp_path: Path) -> None:
    code, out, _ = run_cli([*ONE_CASE, *_ledger(tmp_path, ENTRY.format(backend="*", verdict="FAIL(mask)"))])
    assert code == ExitStatus.OK and "XPASS torch on mtp2-s41: passes although *::* FAIL(mask)" in out, out


def test_a_bad_ledger_is_a_usage_error_naming_the_option(tmp_path: Path) -> None:
    text = ENTRY.format(backend="*", verdict="FAIL(mask)").replace("min = 2", "least = 2")
    code, _, err = run_cli([*ONE_CASE, *_ledger(tmp_path, text)])
    assert code == ExitStatus.USAGE, err
    assert err.startswith("difftest: error: --ledger divergence[0].spec.next_n={'least': 2}: expected an fnmatch "), err


def test_a_missing_ledger_names_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    code, _, err = run_cli([*ONE_CASE, "--ledger", str(missing)])
    assert code == ExitStatus.USAGE and err.startswith(f"difftest: error: --ledger='{missing}': expected an "), err
