"""The table of option applicability (difftest.cli_options.OPTIONS), walked: it names every option of `run` and
`fuzz`; every (option, operation) pair it refuses is one line naming the option, its value and why; every pair
it allows is read by that operation's path (no option silently ignored)."""

from __future__ import annotations

import argparse

import pytest

from difftest import cli
from difftest.cli_options import EVERY, OPTIONS
from difftest.core.kinds import ExitStatus, LengthEncoding, OperationKind
from difftest.workflows import operation_session

COMMANDS = ("run", "fuzz")
OTHERS = [op for op in OperationKind if op != OperationKind.PAGED_LOGITS]
# The words that give each option a value its command parses (fuzz needs a --budget besides).
SAMPLES = {
    "op": [], "backends": ["--backends", "torch-topk"], "backend_module": ["--backend-module", "mine.kernels:topk"],
    "cases": ["--cases", "random"], "budget": ["--budget", "5"], "oracle": ["--oracle", "exact"],
    "count": ["--count", "2"], "seed": ["--seed", "3"], "device": ["--device", "cpu"], "report": ["--report", "r.json"],
    "junit": ["--junit", "j.xml"], "stream": ["--stream", "s.jsonl"], "overwrite": ["--overwrite"],
    "quiet": ["--quiet"], "verbose": ["--verbose"], "repro_dir": ["--repro-dir", "repro"],
    "case_filter": ["--case-filter", "ties-*"], "isolate": ["--isolate"], "timeout": ["--timeout", "30"],
    "startup_timeout": ["--startup-timeout", "30"], "repeat": ["--repeat", "3"],
    "until_failures": ["--until-failures", "1"],
    "next_n": ["--next-n", "2"], "block_sizes": ["--block-sizes", "64"], "batch": ["--batch", "2"],
    "max_model_len": ["--max-model-len", "128"], "heads": ["--heads", "64"], "head_dim": ["--head-dim", "128"],
    "spec": ["--spec", "{}"], "max_batch": ["--max-batch", "2"], "max_context": ["--max-context", "256"],
    "block_size": ["--block-size", "64"], "encoding": ["--encoding", LengthEncoding.PER_ROW.value],
    "layout": ["--layout", "block-split"], "ledger": ["--ledger", "known.toml"], "no_progress": ["--no-progress"],
    "time": ["--time", "3"], "fail_slow": ["--fail-slow"], "resume": ["--resume", "r.json"],
    "sanitize": ["--sanitize", "memcheck"], "sanitize_all": ["--sanitize-all"], "shard": ["--shard", "0/2"],
    "gpus": ["--gpus", "2"], "jobs": ["--jobs", "2"], "metamorphic": ["--metamorphic"],
    "shrink_seconds": ["--shrink-seconds", "1"], "batching": ["--no-batching"], "graph": ["--graph"],
}


def _dests(command: str) -> list[str]:
    parser = cli._subparser(cli.build_parser(), command)
    return [a.dest for a in parser._actions if a.dest != "help"]


def _argv(command: str, op: OperationKind, dest: str) -> list[str]:
    budget = ["--budget", "5"] if command == "fuzz" and dest != "budget" else []
    return [command, "--op", op.value, *budget, *SAMPLES[dest]]


def test_the_table_names_every_option_of_run_and_fuzz_and_no_other():
    options = {dest for command in COMMANDS for dest in _dests(command)}
    assert options == set(OPTIONS) == set(SAMPLES)


def test_every_option_an_operation_refuses_says_why():
    assert all(applies.why_not for applies in OPTIONS.values() if applies.ops != EVERY)


REFUSED = [(command, op, dest) for command in COMMANDS for dest in _dests(command) for op in OTHERS
           if op not in OPTIONS[dest].ops]


@pytest.mark.parametrize(("command", "op", "dest"), REFUSED, ids=lambda v: getattr(v, "value", v))
def test_a_refused_option_is_one_line_naming_it_its_value_and_why(capsys, tmp_path, monkeypatch, command, op, dest):
    monkeypatch.chdir(tmp_path)  # no project's [tool.difftest] defaults
    assert cli.main(_argv(command, op, dest)) == ExitStatus.USAGE
    said = capsys.readouterr().err.splitlines()
    flag = SAMPLES[dest][0]
    assert len(said) == 1 and said[0].startswith(f"difftest: error: {flag}="), said
    assert said[0].endswith(f"not of --op {op.value}: {OPTIONS[dest].why_not}")


class _Reads(argparse.Namespace):
    """A Namespace that remembers which options were read."""

    def __getattribute__(self, name: str):
        if not name.startswith("_"):
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
        return object.__getattribute__(self, name)


ALLOWED = [(command, op, dest) for command in COMMANDS for op in OTHERS for dest in _dests(command)
           if op in OPTIONS[dest].ops]


@pytest.mark.parametrize(("command", "op", "dest"), ALLOWED, ids=lambda v: getattr(v, "value", v))
def test_an_allowed_option_is_read_by_the_operation_path(tmp_path, monkeypatch, command, op, dest):
    monkeypatch.chdir(tmp_path)
    made = operation_session.OperationOutcome([], {})
    monkeypatch.setattr(operation_session, "execute_operation", lambda request: made)
    monkeypatch.setattr(operation_session, "fuzz_operation", lambda campaign: made)
    refuse = cli.refused  # its walk over the whole table is no reading of an option
    monkeypatch.setattr(cli, "refused", lambda args: refuse(argparse.Namespace(**vars(args))))
    args = cli.parse_args(_argv(command, op, dest))
    reads = _Reads(**vars(args))
    assert getattr(cli, f"cmd_{command}")(reads) == ExitStatus.OK
    assert dest in vars(reads)["_read"]
