"""`difftest run`, `fuzz`, `selftest`, `backends`, `replay`, `shrink` and `matrix`: parse the options, call the
library, print.

Nothing heavy is imported until a command runs, so `difftest --help` costs no torch import. The
library's errors name its parameters; FLAGS maps them to the options that set them.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib.util
import io
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from difftest import __version__
from difftest.cli_options import refused
from difftest.core import lifetime
from difftest.core.errors import Interrupted, OutputError, SpecError
from difftest.core.kinds import (
    RELATIONS,
    AnyRelation,
    CacheLayout,
    CaseKind,
    CiSystem,
    Device,
    ExitStatus,
    LengthEncoding,
    OperationKind,
    OracleKind,
    SanitizerTool,
)
from difftest.core.text import printable

if TYPE_CHECKING:
    from tqdm import tqdm

    from difftest.backends import Loaded
    from difftest.engine.config import RunConfig
    from difftest.engine.result import CaseResult
    from difftest.records.bundle import Bundle
    from difftest.records.ledger import Ledger
    from difftest.workflows.fuzz import Progress
    from difftest.workflows.session import RunOutcome, RunRequest

# library parameter -> the option that sets it
FLAGS = {"backends": "--backends", "cases": "--cases", "count": "--count", "seed": "--seed", "next_n": "--next-n",
         "block_sizes": "--block-sizes", "batch": "--batch", "max_model_len": "--max-model-len", "heads": "--heads",
         "head_dim": "--head-dim", "case_filter": "--case-filter", "shard": "--shard", "gpus": "--gpus",
         "device": "--device", "encoding": "--encoding", "layout": "--layout", "isolate": "--isolate",
         "timeout": "--timeout", "repeat": "--repeat", "sanitize": "--sanitize", "sanitize_all": "--sanitize-all",
         "resume": "--resume", "stream": "--stream", "report": "--report", "backend": "--backends",
         "trust": "--trust-bundle", "budget": "--budget", "oracle": "--oracle",
         "spec": "--spec", "until_failures": "--until-failures", "shrink_seconds": "--shrink-seconds",
         "overwrite": "--overwrite", "time": "--time", "fail_slow": "--fail-slow",
         "startup_timeout": "--startup-timeout", "repro_dir": "--repro-dir",
         "max_batch": "--max-batch", "max_context": "--max-context", "block_size": "--block-size",
         "batching": "--batching", "junit": "--junit",
         "matrix_file": "--file", "cell": "CELL", "out": "--out", "reports": "REPORTS", "baseline": "--baseline",
         "ledger": "--ledger", "output": "--output", "budget_seconds": "--seconds",
         "backend_template": "--backend-template", "mutants": "--mutants", "metamorphic": "--metamorphic",
         "graph": "--graph"}


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like every other difftest error, and exit 2."""

    def error(self, message: str) -> NoReturn:
        # "argument --x: 'v': expected ..." (the value types below) reads as every other error: --x='v': expected ...
        found = re.fullmatch(r"argument (\S+?)(?:/\S+)?: ('.*'): (expected .*)", message)
        if found:
            message = f"{found.group(1)}={found.group(2)}: {found.group(3)}"
        self.exit(ExitStatus.USAGE, f"difftest: error: {message} (see {self.prog} --help)\n")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _integer(text: str) -> int:
    """An argparse type: the integer of `text`, or one line saying an integer was expected (the
    library checks the range)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None


def _names(text: str) -> tuple[str, ...]:
    """An argparse type: the comma-separated names of `text`, at least one (an empty --backends is a
    mistake, not every backend); an empty item among them is kept, for the library to refuse (`a,,b`)."""
    names = tuple(name.strip() for name in text.split(","))
    if not any(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated backend names (leave the option out "
                                         "for every registered backend)")
    return names


def _path(text: str) -> Path:
    """An argparse type: the path of `text`, which must not be empty (Path('') is the working folder)."""
    if not text:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a path")
    return Path(text)


def _relation_names(text: str) -> tuple[str, ...]:
    """An argparse type: the comma-separated names of `text`, at least one; whose relations they must be waits
    for --op (_relations)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 'all' or comma-separated relation names")
    return names


def _relations(op: OperationKind, names: tuple[str, ...]) -> tuple[AnyRelation, ...]:
    """The relations of --metamorphic `names` ('all': every one) for --op `op`, in its enum's order; SpecError
    naming the option's value and the relations `op` has, or the operations that have some."""
    if not names:
        return ()
    kind, shown = RELATIONS[op], ",".join(names)  # an operation without relations refused them (cli_options)
    if set(names) == {"all"}:
        return tuple(kind)
    known = [r.value for r in kind]
    if not set(names) <= set(known):
        raise SpecError("--metamorphic", shown, f"'all' or comma-separated relations of --op {op.value} among {known}")
    return tuple(r for r in kind if r.value in names)


def _enum(kind: type[enum.Enum]) -> Callable[[str], enum.Enum]:
    """An argparse type for `kind`: its member of a value, or one line naming the values allowed."""

    def member(text: str) -> enum.Enum:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected one of {[m.value for m in kind]}") from None

    member.__name__ = kind.__name__
    member.kind = kind  # type: ignore[attr-defined]  # what a [tool.difftest] value of the option may be
    return member


def _add_run(commands: argparse._SubParsersAction) -> None:
    # No abbreviated options: a --gpus run hands its command line to its children less a few options.
    run = commands.add_parser("run", help="run cases through backends and compare with the oracle", allow_abbrev=False)
    _add_operation(run)
    _add_backend_choice(run)
    run.add_argument("--cases", type=_enum(CaseKind), default=CaseKind.ENVELOPE,
                     help="envelope: cases inside each backend's declared envelope at this device's scale "
                          "(production shapes on a GPU, small ones on the CPU); random, edges or all: the fixed "
                          "toy-shape suite (default: envelope)")
    run.add_argument("--budget", type=float, metavar="SECONDS",
                     help="start no case after this many seconds; the report lists those not started")
    run.add_argument("--oracle", type=_enum(OracleKind),
                     help="exact (float64 torch) or fast (the fused Triton oracle) (default: fast on cuda, "
                          "exact on cpu); none: no oracle: masks judged against the true windows, values against "
                          "the other backends (consensus), a disagreement settled by the metamorphic relations")
    run.add_argument("--count", type=int, help="seeds per random spec (default: 1 for envelope suites, 6 for "
                     "random and all; 1 with --spec)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--next-n", type=_int_list, help="e.g. 1,2,4: one copy of every spec per value")
    run.add_argument("--block-sizes", type=_int_list, help="e.g. 1,64: one copy of every spec per value")
    run.add_argument("--batch", type=int, help="B of the random specs")
    run.add_argument("--max-model-len", type=int, help="max_model_len of the random specs")
    run.add_argument("--heads", type=int, help="H of the random specs")
    run.add_argument("--head-dim", type=int, help="D of the random specs")
    run.add_argument("--spec", metavar="JSON", help="one CaseSpec as JSON (fields not given keep their defaults) "
                     "instead of the suite: --count cases from --seed on")
    run.add_argument("--device", type=_enum(Device), default=Device.CPU, help="cpu or cuda (default: cpu)")
    run.add_argument("--report", type=_path, metavar="PATH", help="write the JSON report here")
    run.add_argument("--junit", type=_path, metavar="PATH", help="write a JUnit XML file here: one testcase per "
                     "backend and case, a failure's text its table row and failure block")
    run.add_argument("--ledger", type=_path, metavar="PATH",
                     help="known divergences (TOML, docs/ledger.md): a failure an entry expects is XFAIL and does "
                          "not fail the run; a pass that a strict entry covers does")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the report and stream an earlier run left at those paths (refused otherwise, "
                          "unless --resume)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_loudness(run)
    run.add_argument("--repro-dir", type=_path, metavar="DIR", help="write a reproducer bundle here for every failure")
    run.add_argument("--case-filter", action="append", default=[], metavar="GLOB",
                     help="run only the cases whose name matches (fnmatch, e.g. 'length-one-*'); repeatable")
    _add_feeding(run)
    run.add_argument("--time", type=_integer, metavar="K",
                     help="after the checked launches, time K more of each backend's per-layer kernel call per "
                          "case (CUDA events, L2 flushed, after warm-up; perf_counter on the CPU) and report the "
                          "median; siblings (DeepGEMM native/flattened/varlen, AITER stage1/fused) are compared "
                          "in a performance section")
    _add_metamorphic(run)
    run.add_argument("--graph", action="store_true",
                     help="also capture each backend's per-layer call once per case (its prepare, and a CUDA graph "
                          "on cuda) and replay it on the case's replay family (lengths grown and shrunk, requests "
                          "emptied, blocks moved, fresh values) written into the captured buffers in place; each "
                          "replay is a result <case>@replay<i>")
    run.add_argument("--fail-slow", action="store_true",
                     help="with --time: exit 1 when a backend is slower than its fastest sibling on a case by "
                          "more than the factor its contract allows")
    run.add_argument("--stream", type=_path, metavar="PATH.jsonl",
                     help="append each result to this JSONL file the moment it is made, so a killed run "
                          "keeps its results (default: the --report path with suffix .jsonl)")
    run.add_argument("--resume", type=_path, metavar="REPORT",
                     help="a JSON report or JSONL stream of an earlier run of the same cases: its (backend, "
                          "case) results are kept and only the missing pairs run")
    run.add_argument("--sanitize", type=_enum(SanitizerTool),
                     help="replay each failing result under NVIDIA compute-sanitizer in a fresh process and "
                          "attach its findings (cuda)")
    run.add_argument("--sanitize-all", action="store_true",
                     help="with --sanitize: replay every result that ran, passing ones too")
    run.add_argument("--shard", metavar="I/N",
                     help="run only the planned cases (after --case-filter) whose index in the plan is I mod N")
    run.add_argument("--gpus", type=int, metavar="N",
                     help="spread the cases over N child processes, one GPU each (shard I of N on entry I of "
                          "CUDA_VISIBLE_DEVICES, else on GPU I), merged in plan order into one table, --report and "
                          "--stream (written when the children end); --device cuda only; not with --resume or --shard")


def _add_operation(command: argparse.ArgumentParser) -> None:
    """--op, as `run` and `fuzz` take it."""
    command.add_argument("--op", type=_enum(OperationKind), default=OperationKind.PAGED_LOGITS,
                         help="the indexer stage to test: paged-logits (decode), ragged-logits (prefill), topk, "
                              "indexer (a logits backend then a top-k backend) (default: paged-logits)")


def _add_backend_choice(command: argparse.ArgumentParser) -> None:
    """The options that choose backends, as `run` and `fuzz` take them."""
    command.add_argument("--backends", type=_names, help="comma-separated registered names, package.module:object "
                         "paths, or the names of --backend-module backends (default: every registered backend)")
    command.add_argument("--backend-module", action="append", default=[], metavar="PKG.MOD:OBJ",
                         help="a user backend: a Backend, a factory, or a difftest.backend-decorated function "
                              "(repeatable)")


def _backend_names(args: argparse.Namespace) -> tuple[str, ...] | None:
    """What --backends and --backend-module name, in that order (None: neither was given)."""
    return (*(args.backends or ()), *args.backend_module) or None


def _add_feeding(command: argparse.ArgumentParser, repeat: int = 1) -> None:
    """The options that say how backends are fed and guarded (RunConfig), as `run`, `fuzz` and `selftest` take
    them (`repeat`: the command's default launches per case)."""
    command.add_argument("--encoding", type=_enum(LengthEncoding),
                         help="what-if: hand every backend this length encoding instead")
    command.add_argument("--layout", type=_enum(CacheLayout),
                         help="what-if: hand every backend this cache layout instead")
    command.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                         help="run each backend in a worker process of its own, so a crash or a hang costs only "
                              "its verdict (CRASH, TIMEOUT) (default: on for cuda or with --timeout, off for cpu)")
    command.add_argument("--timeout", type=float, metavar="SECONDS",
                         help="seconds one case (all its --repeat launches) may take in a worker before it is "
                              "killed: TIMEOUT (needs isolation; default 600)")
    command.add_argument("--startup-timeout", type=float, default=600.0, metavar="SECONDS",
                         help="seconds a worker may take to import and build its backend before it is killed: "
                              "TIMEOUT (default 600)")
    command.add_argument("--repeat", type=int, default=repeat, metavar="K",
                         help="launch each backend K times per case: bitwise-stable, stable within tolerance, "
                              f"or unstable = FAIL(nondeterministic) (default: {repeat})")


def _add_metamorphic(command: argparse.ArgumentParser, ops: tuple[OperationKind, ...] = tuple(RELATIONS)) -> None:
    """--metamorphic, as `run` and `fuzz` (every operation with relations, by --op) and `selftest` (paged logits)
    take it."""
    names = "; ".join(f"--op {op.value}: {', '.join(r.value for r in RELATIONS[op])}" for op in ops)
    command.add_argument("--metamorphic", type=_relation_names, nargs="?", const=("all",), default=(),
                         metavar="RELATIONS",
                         help="after each result that ran, check these metamorphic relations on its case (all when "
                              f"none are named; comma-separated among {names}): a launch of each related case "
                              "(paged logits: and one more of the case); a relation that does not hold is "
                              "FAIL(metamorphic)")


def _add_loudness(command: argparse.ArgumentParser) -> None:
    loudness = command.add_mutually_exclusive_group()
    loudness.add_argument("--quiet", "-q", action="store_true",
                          help="print only the verdict line and errors (no table, no progress bar)")
    loudness.add_argument("--verbose", "-v", action="store_true",
                          help="print every result, not only the failures, and every failure block")


def _duration(text: str) -> float:
    """Seconds of '90', '90s', '10m' or '1h'."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        return float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 90, 90s, 10m or 1h") from None


def _add_matrix(commands: argparse._SubParsersAction) -> None:
    matrix = commands.add_parser("matrix", help="the CI matrix: plan its cells, emit CI files, run a cell, merge "
                                 "the cells' reports (docs/matrix.md)")
    actions = matrix.add_subparsers(dest="matrix_command", required=True)
    where = ("the matrix file: a difftest.toml ([matrix]) or a pyproject.toml ([tool.difftest.matrix]) "
             "(default: the first of them in the working folder that has one)")
    plan = actions.add_parser("plan", help="list the cells and, for every combination left out, why")
    plan.add_argument("--file", type=Path, metavar="F", help=where)
    emit = actions.add_parser("emit", help="write a GitHub Actions workflow or a Buildkite pipeline: a job per "
                              "cell and a merge job")
    emit.add_argument("system", type=_enum(CiSystem), metavar="github|buildkite")
    emit.add_argument("--file", type=Path, metavar="F", help=where)
    emit.add_argument("-o", "--output", metavar="PATH", help="write it here (default: stdout); a link is written "
                      "through")
    run = actions.add_parser("run", help="run one cell here; write its report.json and junit.xml")
    run.add_argument("cell", metavar="CELL", help="a cell as `difftest matrix plan` names it, e.g. cpu/installed/quick")
    run.add_argument("--file", type=Path, metavar="F", help=where)
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="where its files go (default: difftest-matrix/<its CI id>)")
    merge = actions.add_parser("merge", help="merge the cells' reports: summary.md, index.html, heatmap.png, "
                               "junit.xml, merged.json; exit 1 on new failures only")
    merge.add_argument("reports", type=Path, nargs="+", metavar="REPORTS", help="report.json files of "
                       "`difftest matrix run`")
    merge.add_argument("--out", required=True, metavar="DIR", help="the folder the merged files go to")
    merge.add_argument("--baseline", type=Path, metavar="MERGED.json", help="an earlier merged.json: list new, "
                       "fixed and changed failures, and fail on the new ones only")
    merge.add_argument("--ledger", type=Path, metavar="PATH", help="known divergences (TOML): failures it names "
                       "are listed, never new")


def _add_fuzz(commands: argparse._SubParsersAction) -> None:
    fuzz = commands.add_parser("fuzz", help="a time-budgeted campaign: envelope cases with fresh seeds, failures "
                               "grouped by root cause, each bundled and shrunk, all within the budget",
                               allow_abbrev=False)
    fuzz.add_argument("--budget", type=_duration, required=True,
                      help="how long the whole campaign takes, shrinking included: 90s, 10m, 1h")
    fuzz.add_argument("--until-failures", type=int, metavar="N", help="stop drawing at N distinct failure signatures")
    _add_operation(fuzz)
    _add_backend_choice(fuzz)
    fuzz.add_argument("--device", type=_enum(Device), default=Device.CPU, help="cpu or cuda (default: cpu)")
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--oracle", type=_enum(OracleKind), help="exact or fast (default: fast on cuda, exact on cpu)")
    _add_feeding(fuzz)
    fuzz.add_argument("--repro-dir", type=Path, metavar="DIR", help="a bundle per distinct failure, and its shrunk "
                      "one (default: a temporary folder, printed, when there is shrinking to do)")
    fuzz.add_argument("--stream", type=Path, metavar="PATH.jsonl", help="every result, as it is made")
    fuzz.add_argument("--report", type=Path, metavar="PATH", help="write every result and the signatures (with "
                      "their variants, bundles and repro lines) as JSON here")
    fuzz.add_argument("--junit", type=Path, metavar="PATH", help="write a JUnit XML file of every result here")
    fuzz.add_argument("--shrink-seconds", type=float, metavar="S",
                      help="the budget's share for bundling and shrinking: drawing stops this long before the "
                      "budget's end once a failure is found (default: a quarter of --budget; 0: no shrinking)")
    _add_regime(fuzz, "bounds on the drawn cases (default: the whole envelope)")
    fuzz.add_argument("--jobs", type=int, metavar="N",
                      help="N campaigns side by side, each in its own process with its own workers and its own "
                      "share of the plan, their results joined (default: 1)")
    fuzz.add_argument("--batching", action=argparse.BooleanOptionalAction,
                      help="small cases of one shape in one launch where every backend allows it; a failure "
                      "is tried again, with the batch's other failures, then alone (default: on)")
    fuzz.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    _add_metamorphic(fuzz)
    _add_loudness(fuzz)


def _add_regime(command: argparse.ArgumentParser, description: str) -> None:
    """The regime's bounds (difftest.generators.regime.Regime), as `fuzz` and `selftest` take them."""
    regime = command.add_argument_group("regime", description)
    regime.add_argument("--max-batch", type=int, metavar="B", help="at most B requests per case")
    regime.add_argument("--max-context", type=int, metavar="N", help="max_model_len at most N")
    regime.add_argument("--heads", type=int, help="only cases with this many heads")
    regime.add_argument("--head-dim", type=int, help="only cases of this head dim")
    regime.add_argument("--block-size", type=int, help="only cases of this block size")


def _add_selftest(commands: argparse._SubParsersAction) -> None:
    selftest = commands.add_parser("selftest", help="how strong is this configuration: mutants of a correct kernel, "
                                   "one per bug class, run as `difftest run` would run them; the mutation score",
                                   allow_abbrev=False)
    selftest.add_argument("--device", type=_enum(Device), default=Device.CPU, help="cpu or cuda (default: cpu)")
    selftest.add_argument("--budget", type=_duration, help="after the plan, a fuzz round this long (90s, 10m) for the "
                          "paged mutants not caught yet and those that must pass (default: none)")
    selftest.add_argument("--fuzz-only", action="store_true", help="run none of the planned paged-logits cases: "
                          "the score is the fuzz round's alone, by any family (needs --budget)")
    selftest.add_argument("--backend-template", metavar="PKG.MOD:OBJ", help="a backend (registered name or "
                          "package.module:object) whose envelope the mutants take (heads, head dims, block sizes, "
                          "next_n, longest context, tiles, partition, mask, tolerance): the score is for it")
    selftest.add_argument("--mutants", type=_names, help="comma-separated mutants to run (names or keys; default: "
                          "all of difftest.backends.mutants.CATALOGUE, the top-k and ragged ones included)")
    selftest.add_argument("--seed", type=int, default=0)
    selftest.add_argument("--oracle", type=_enum(OracleKind),
                          help="exact or fast (default: fast on cuda, exact on cpu)")
    selftest.add_argument("--case-filter", action="append", default=[], metavar="GLOB",
                          help="run only the planned paged-logits cases whose name matches (fnmatch); "
                          "repeatable (the top-k and ragged mutants run their whole plans)")
    selftest.add_argument("--report", type=Path, metavar="PATH", help="write every result and the score (its "
                          "`selftest` section) as JSON here")
    _add_feeding(selftest, repeat=2)  # the nondeterministic mutants' launches are compared
    _add_metamorphic(selftest, (OperationKind.PAGED_LOGITS,))
    _add_regime(selftest, "bounds on the fuzz round's cases (default: the whole envelope)")
    _add_loudness(selftest)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = _Parser(prog="difftest", description="Prove or disprove, row by row, that a paged MQA logits kernel "
                     "computes what it should. Documentation: docs/README.md in the repository.")
    parser.add_argument("--version", action="version", version=f"difftest {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_run(commands)
    replay = commands.add_parser("replay", help="re-run a reproducer bundle; exit 1 if it still fails")
    replay.add_argument("bundle", type=_path, metavar="BUNDLE")
    replay.add_argument("--backends", type=_names, help="replay through this backend instead of the recorded one")
    replay.add_argument("--trust-bundle", action="store_true",
                        help="import the module the bundle names as its backend (that runs its code)")
    replay.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="run the backend in a worker process (default: as the recorded run did)")
    shrink = commands.add_parser("shrink", help="reduce a bundle's failing case and write it as a new bundle")
    shrink.add_argument("bundle", type=_path, metavar="BUNDLE")
    shrink.add_argument("--seconds", type=float, default=30.0, help="time budget (default: 30)")
    shrink.add_argument("--out", type=_path, metavar="DIR", help="where the new bundle goes (default: beside BUNDLE)")
    shrink.add_argument("--backends", type=_names, help="shrink through this backend instead of the recorded one")
    shrink.add_argument("--trust-bundle", action="store_true",
                        help="import the module the bundle names as its backend (that runs its code)")
    _add_fuzz(commands)
    _add_selftest(commands)
    backends = commands.add_parser("backends", help="list backends and whether each can run here")
    backends.add_argument("--device", type=_enum(Device), default=Device.CPU)
    _add_matrix(commands)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options of `argv` (default: sys.argv[1:]); `argv` itself goes along as args.argv, for the
    run info and for the children of a --gpus run."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args


def _project_file() -> Path | None:
    """The current project's pyproject.toml: the first in the working folder or a folder above it."""
    return next((folder / "pyproject.toml" for folder in (Path.cwd(), *Path.cwd().parents)
                 if (folder / "pyproject.toml").is_file()), None)


def _with_project_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """`args` (of `run`) parsed again with the [tool.difftest] defaults of the current project's
    pyproject.toml put before the command line's own options: an option given overrides its default,
    and args.argv (the report's command, a --gpus run's children) shows the defaults as options.
    A child of a spread run is handed them so: it reads none itself. SpecError naming the file and
    the key for a table that does not fit (_project_defaults)."""
    from difftest.core import schema  # deferred: loads pydantic
    from difftest.workflows import spread  # deferred: loads pydantic, and torch

    path = _project_file()
    if path is None or spread.PARENT in os.environ:
        return args
    tool = schema.read_toml(path, "pyproject", "pyproject.toml").get("tool")
    table = tool.get("difftest") if isinstance(tool, dict) else None
    if table is None:
        return args
    run = _subparser(build_parser(), "run")
    options = {_long_name(a): a for a in run._actions if a.option_strings and a.dest != "help"}
    kinds = {key: _option_kind(action) for key, action in options.items()}
    defaults = _project_defaults(table, kinds, f"{path} [tool.difftest] ")
    given = _given(run, args.argv[1:])
    words = [w for key, value in defaults.items() if options[key].dest not in given
             for w in _words(options[key], value)]
    return parse_args([args.argv[0], *words, *args.argv[1:]])


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def _long_name(action: argparse.Action) -> str:
    """'case-filter' of --case-filter: the option's [tool.difftest] key."""
    return next(s for s in action.option_strings if s.startswith("--"))[2:]


def _option_kind(action: argparse.Action) -> object:
    """What a [tool.difftest] value of `action`'s option may be: a difftest.core.schema annotation."""
    from difftest.core import schema  # deferred: loads pydantic

    if action.nargs == 0:  # --flag, --x/--no-x
        return schema.Bool
    if isinstance(action, argparse._AppendAction):
        return schema.ListOf(schema.Text(schema.MAX_TEXT), schema.MAX_ITEMS, "a list of strings")
    if hasattr(action.type, "kind"):
        return schema.OneOf(action.type.kind)
    whole = schema.Rule(lambda v: type(v) is int, "an integer").type(int)
    number = schema.Rule(lambda v: type(v) in (int, float) and math.isfinite(v), "a number").type()
    names = schema.ListOf(schema.Filled("a non-empty name"), schema.MAX_ITEMS,
                          'a list of names, e.g. ["torch", "mymod:kernel"]')
    ints = schema.IntList(-(1 << 63), (1 << 63) - 1, schema.MAX_ITEMS, "a list of integers, e.g. [1, 2, 4]")
    kinds = {int: whole, _integer: whole, float: number, _duration: number, _names: names, _int_list: ints}
    return kinds.get(action.type, schema.Text(schema.MAX_TEXT))


PROJECT_TABLES = ("matrix",)  # [tool.difftest.<name>] tables that other commands read


def _project_defaults(data: object, options: dict[str, object], where: str) -> dict[str, object]:
    """The [tool.difftest] table `data` of a pyproject.toml: each key one of `options` (an option's
    name without its dashes -> what its value may be), the tables of PROJECT_TABLES left to their
    readers; the keys given, with their values. SpecError naming `where` and the key otherwise."""
    from pydantic import Field, create_model  # deferred: loads pydantic

    from difftest.core import schema  # deferred: loads pydantic

    if not isinstance(data, dict):
        raise SpecError(where.rstrip(), schema.shown(data), "a table of `difftest run` options")
    base = type("ProjectDefaultsBase", (schema.Model,), {
        "__module__": __name__, "what": "a table of `difftest run` options", "unknown_name": f"{where}keys",
        "unknown_expected": f"`difftest run` options among {sorted(options)} (or the tables {list(PROJECT_TABLES)})"})
    # Not Optional: TOML has no null. The None default is never validated, and model_dump leaves it out.
    fields = {key.replace("-", "_"): (kind, Field(None, alias=key)) for key, kind in options.items()}
    model = create_model("ProjectDefaultsModel", __base__=base, **fields)  # type: ignore[call-overload]
    given = {key: value for key, value in data.items() if key not in PROJECT_TABLES}
    return schema.validate(model, given, where).model_dump(by_alias=True, exclude_unset=True)


def _given(parser: argparse.ArgumentParser, words: Sequence[str]) -> set[str]:
    """The dests of the options `words` give; one option of a mutually exclusive group stands for all."""
    given = {parser._option_string_actions[w.partition("=")[0]].dest for w in words
             if w.partition("=")[0] in parser._option_string_actions}
    for group in parser._mutually_exclusive_groups:
        if any(action.dest in given for action in group._group_actions):
            given |= {action.dest for action in group._group_actions}
    return given


def _words(action: argparse.Action, value: object) -> list[str]:
    """The command-line words that give `action`'s option `value` (a validated [tool.difftest] value)."""
    option = f"--{_long_name(action)}"
    if action.nargs == 0:
        negated = isinstance(action, argparse.BooleanOptionalAction) and not value
        return [f"--no-{option[2:]}"] if negated else [option] if value else []
    if isinstance(action, argparse._AppendAction):
        return [f"{option}={item}" for item in value]  # type: ignore[attr-defined]
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return [f"{option}={text}"]  # with '=': a value that starts with '-' is not taken for an option


def main(argv: Sequence[str] | None = None) -> int:
    """The `difftest` command: its exit status (difftest.core.kinds.ExitStatus). Everything it prints goes
    through difftest.core.text.printable (_PrintableStream)."""
    with _printable_output(), _termination_interrupts():
        return _main(argv)


@contextlib.contextmanager
def _termination_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM stops the command as Ctrl-C does (_as_ctrl_c): `timeout`, a CI job's cancel
    and a batch scheduler send it, and the results so far must reach the report (marked incomplete) rather than
    die with the process. A SIGINT the command was started ignoring (a shell's `command &`) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _as_ctrl_c)
    if saved[signal.SIGINT] != signal.SIG_IGN:
        signal.signal(signal.SIGINT, _as_ctrl_c)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _as_ctrl_c(_signum: int, _frame: object) -> None:
    """SIGINT's and SIGTERM's handler: the first stops the command, as a KeyboardInterrupt (raised here, not as a
    SIGINT, which a command started in the background ignores), which every layer lets through to the report
    marked incomplete (a backend call's guard tells it from one the backend raised itself). Those after it are
    ignored while the command stops: `timeout` and a Ctrl-C sent to the process group signal this process and
    the watching one, which passes it on, and a second KeyboardInterrupt would cut the report short."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return int(exc.code or 0)
    commands = {"run": cmd_run, "backends": cmd_backends, "replay": cmd_replay, "shrink": cmd_shrink,
                "fuzz": cmd_fuzz, "selftest": cmd_selftest, "matrix": cmd_matrix}
    try:
        with _working_folder_unimportable(_untrusted_bundle(args)):
            status = commands[args.command](args)
        sys.stdout.flush()  # a reader that left (`| head`) shows here, not as a traceback at exit
        return status
    except BrokenPipeError:
        return _reader_left(ExitStatus.OK)
    except SystemExit as exc:  # argparse, parsing a command line with [tool.difftest]'s defaults: it said why
        return int(exc.code or 0)
    except SpecError as exc:
        print(f"difftest: error: {FLAGS.get(exc.field, exc.field)}={exc.value!r}: expected {exc.expected}",
              file=sys.stderr)
        return ExitStatus.USAGE
    except OutputError as exc:
        print(f"difftest: error: {FLAGS.get(exc.field, exc.field)}={exc.path!r}: {exc.reason}", file=sys.stderr)
        return ExitStatus.IO
    except Interrupted as exc:
        resume = f" (--resume {exc.kept[0]} continues it)" if exc.resumable else ""
        where = f"; kept in {', '.join(exc.kept)}{resume}" if exc.kept else ""
        print(f"\ndifftest: interrupted after {exc.results} results{where}", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    except KeyboardInterrupt:
        print("\ndifftest: interrupted", file=sys.stderr)
        return ExitStatus.INTERRUPTED


class _PrintableStream:
    """A text stream writing to `stream` what printable() makes of each write: a case name, a reason or
    a path that came from a bundle, a backend or a file reaches the terminal as text, never as an escape
    sequence, whichever print writes it. Anything else is `stream`'s own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


@contextlib.contextmanager
def _printable_output() -> Iterator[None]:
    """sys.stdout and sys.stderr as _PrintableStreams while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PrintableStream(sys.stdout), _PrintableStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _raw(stream: TextIO) -> TextIO:
    """The stream a _PrintableStream writes to (the progress bar draws with carriage returns)."""
    return stream.stream if isinstance(stream, _PrintableStream) else stream  # type: ignore[return-value]


def _untrusted_bundle(args: argparse.Namespace) -> bool:
    """Whether the command reads a bundle it was not told to trust."""
    return args.command in ("replay", "shrink") and not args.trust_bundle


@contextlib.contextmanager
def _working_folder_unimportable(untrusted: bool) -> Iterator[None]:
    """While the block runs, when `untrusted`: the working folder off sys.path (`python -m` puts it first),
    so that a package shipped in a bundle's folder (`cd bundle && python -m difftest replay .`) is not
    imported in place of torch or numpy. A module named with --backends is still found there
    (difftest.backends.load_backend looks in the working folder, after the installed packages)."""
    here = os.path.realpath(os.getcwd())
    saved = list(sys.path)
    if untrusted:
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    try:
        yield
    finally:
        if untrusted:
            sys.path[:] = saved


def entry() -> int:
    """The installed `difftest` command and `python -m difftest`: main() in a child process this one
    watches (difftest.core.lifetime.supervise). A command whose process something ended before the
    command did (a backend run in-process calling os._exit(0), which would otherwise read as a run that
    passed) exits 1 with a line saying so; one killed by a signal dies of that signal here too."""
    ended = lifetime.supervise(main)
    if not ended.finished and not ended.sent:  # a kill or a Ctrl-C the user sent needs no explaining
        print(f"difftest: error: {_ended_early(ended)}; every result already in the stream is kept", file=sys.stderr)
    if ended.signum is not None:
        lifetime.die_by(ended.signum)
    return ended.status if ended.finished and ended.status is not None else ExitStatus.FAILED


def _ended_early(ended: lifetime.Ended) -> str:
    """Why the command's process ended before the command did, for one line."""
    if ended.signum == signal.SIGKILL:  # no code of its own can end a process so: the kernel or another process
        return ("the command's process was killed by SIGKILL before the command ended: the out-of-memory killer "
                "ends a process so (or a kill -9 of that process alone)")
    return (f"the command's process ended ({ended.how}) before the command did: code run in it (a backend run "
            "in-process: --isolate runs each in a worker of its own) called os._exit(), exit(), exec() or died")


def _reader_left(status: int) -> int:
    """`status`, once stdout's reader has gone (`difftest backends | head -1`): what is still buffered
    goes to /dev/null, so neither this write nor the one at exit raises BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # stdout is no file (in-process tests)
        pass
    return status


def cmd_backends(args: argparse.Namespace) -> int:
    """`difftest backends`: every backend, grouped by operation, and whether it runs here."""
    from difftest.backends import available_names, get_backends  # deferred: loads torch
    from difftest.operations import OPERATIONS  # deferred: loads torch

    print(f"{OperationKind.PAGED_LOGITS.value}: {OPERATIONS[OperationKind.PAGED_LOGITS].summary}")
    for name in available_names():
        try:
            backend = get_backends([name])[0]
            reason = backend.unavailable_reason(args.device.value)
            contract = backend.contract
            detail = (f"{contract.length_encoding.value}, {contract.cache_layout.value}, "
                      f"{contract.mask.value}, {contract.library}")
        except SpecError as exc:
            reason, detail = str(exc), ""
        status = "available" if reason is None else f"unavailable: {reason}"
        print(f"  {name:<40} {status}" + (f"  [{detail}]" if detail else ""))
    for kind, op in OPERATIONS.items():
        if kind != OperationKind.PAGED_LOGITS:
            print(f"\n{kind.value}: {op.summary}")
            for name, make in op.backends().items():
                backend = make()
                reason = backend.unavailable_reason(args.device.value)
                status = "available" if reason is None else f"unavailable: {reason}"
                print(f"  {name:<40} {status}" + (f"  [{backend.contract.library}]" if reason is None else ""))
    return ExitStatus.OK


def cmd_run(args: argparse.Namespace, shard_envs: list[dict[str, str]] | None = None) -> int:
    """`difftest run`. With --gpus, or with `shard_envs` (what each child's environment adds; how the
    tests spread a CPU run), the cases are spread over child processes, one shard each."""
    args = _with_project_defaults(args)
    with _claimed(args.junit, "junit"):
        if args.op != OperationKind.PAGED_LOGITS:
            return _run_operation(args)
        return _run_and_print(args, shard_envs)


def _run_operation(args: argparse.Namespace) -> int:
    """`difftest run --op X` for an operation other than paged logits."""
    from difftest.workflows.operation_session import OperationRequest, execute_operation  # deferred: loads torch

    refused(args)
    config = _run_config(args, metamorphic=_relations(args.op, args.metamorphic))
    request = OperationRequest(operation=args.op, cases=args.cases, seed=args.seed, count=args.count or 1,
                               backends=_backend_names(args), case_filter=tuple(args.case_filter), config=config,
                               report=args.report, stream=args.stream, junit=args.junit, repro_dir=args.repro_dir,
                               budget=args.budget, overwrite=args.overwrite, argv=tuple(args.argv))
    outcome = execute_operation(request)
    _print_untested(outcome.untested)
    _print_operation(outcome.results, args.verbose, args.quiet, outcome.repro)
    if outcome.not_started and not args.quiet:
        print(f"\nbudget spent: {len(outcome.not_started)} planned cases not started (listed in the report)")
    if args.report and not args.quiet:
        print(f"\nreport: {args.report}")
    if outcome.bundles and not args.quiet:
        print(f"\nreproducers: {outcome.bundles} bundle(s) under {args.repro_dir} (difftest replay BUNDLE)")
    if "junit" in outcome.written:
        print(f"junit: {outcome.written['junit']}")
    return outcome.status


def _print_operation(results: list[CaseResult], verbose: bool, quiet: bool,
                     repro: Mapping[tuple[str, str], str] | None = None) -> None:
    """The table, every result when `verbose`, the failures (each with its line of `repro`, by backend and case);
    the verdict line alone when `quiet`."""
    from difftest.records import report  # deferred: loads torch

    if quiet:
        print(_verdict_line(results, ExitStatus.FAILED if any(r.verdict.failed for r in results) else ExitStatus.OK))
        return
    print(report.render_table(report.summarize(results)))
    if verbose:
        print("\n" + report.render_results(results))
    failures = report.render_failures(results, limit=len(results) if verbose else 20, repro=repro)
    if failures:
        print("\n" + failures)


def _backend_names(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The backends --backends and --backend-module name, in that order; None for neither (every one)."""
    return ((args.backends or ()) + tuple(args.backend_module)) or None


@contextlib.contextmanager
def _claimed(path: Path | None, field: str) -> Iterator[None]:
    """A file the CLI writes after the run (--junit): checked writable and locked (as the session locks
    the report and the stream) from before the first case until the block ends."""
    if path is None:
        yield
        return
    from difftest.core.files import OutputLock, check_writable  # deferred: with the session

    check_writable(path, field)
    lock = OutputLock(path.resolve(), field).acquire()  # beside the file a link points to, as the report's
    if lock.note:
        print(f"difftest: note: {lock.note}", file=sys.stderr)
    try:
        yield
    finally:
        lock.release()


def _run_and_print(args: argparse.Namespace, shard_envs: list[dict[str, str]] | None) -> int:
    from difftest.workflows import session  # deferred: loads torch and the runner

    request = _run_request(args)
    progress = _Progress(enabled=not (args.no_progress or args.quiet) and sys.stderr.isatty())
    try:
        outcome = session.execute(request, on_result=progress.step, shard_envs=shard_envs,
                                  on_planned=progress.planned)
    finally:
        progress.close()
    for note in outcome.notes:
        print(f"difftest: note: {note}", file=sys.stderr)
    _print_untested(outcome.untested)
    try:
        if args.quiet:
            print(_verdict_line(outcome.results, outcome.status))
        else:
            _print_outcome(request, outcome, verbose=args.verbose)
            _print_ledger(outcome)
        sys.stdout.flush()
    except BrokenPipeError:  # `difftest run | head`: the run's status stands
        return _reader_left(outcome.status)
    if "junit" in outcome.written:
        print(f"junit: {outcome.written['junit']}")
    return outcome.status


def _print_untested(untested: dict[str, str]) -> None:
    """One error line for each backend asked for by name that tested nothing, with why."""
    for name, why in untested.items():
        print(f"difftest: error: backend {name!r}, asked for by name, tested nothing: {why}", file=sys.stderr)


def _print_ledger(outcome: RunOutcome) -> None:
    """The XFAIL and XPASS lines of --ledger."""
    from difftest.records.ledger import render_ledger  # deferred: with session, above

    text = render_ledger(outcome.ledger, outcome.results) if outcome.ledger else ""
    if text:
        print("\n" + text)


def _run_request(args: argparse.Namespace) -> RunRequest:
    """The RunRequest of the options."""
    from difftest.engine.plan import Shard, SuiteRequest  # deferred: with session, below
    from difftest.workflows.session import RunRequest  # deferred: loads torch and the runner

    spec = _spec(args.spec) if args.spec is not None else None  # an empty --spec is refused, not ignored
    suite = SuiteRequest(cases=args.cases, count=args.count, seed=args.seed, next_n=args.next_n,
                         block_sizes=args.block_sizes, batch=args.batch, max_model_len=args.max_model_len,
                         heads=args.heads, head_dim=args.head_dim, spec=spec,
                         case_filter=tuple(args.case_filter), shard=Shard.parse(args.shard) if args.shard else None)
    config = _run_config(args, sanitize=args.sanitize, sanitize_all=args.sanitize_all, time=args.time,
                         metamorphic=_relations(args.op, args.metamorphic), graph=args.graph)
    return RunRequest(suite=suite, backends=_backend_names(args), config=config, report=args.report, stream=args.stream,
                      junit=args.junit, resume=args.resume, repro_dir=args.repro_dir, gpus=args.gpus,
                      budget=args.budget, argv=tuple(args.argv), overwrite=args.overwrite, fail_slow=args.fail_slow,
                      ledger=_ledger(args.ledger))


def _ledger(path: Path | None) -> Ledger | None:
    """The ledger of --ledger, read before any case runs: a bad file is a usage error at once; a bad
    entry is named under --ledger, as --spec names a spec's field."""
    from difftest.records.ledger import load_ledger  # deferred: with session, above

    try:
        return load_ledger(path) if path else None
    except SpecError as exc:
        if exc.field == "ledger":  # the file itself: FLAGS names it
            raise
        raise SpecError(f"--ledger {exc.field}", exc.value, exc.expected) from None


def _spec(text: str) -> object:
    """The CaseSpec of --spec; its errors name the spec's field under --spec."""
    from difftest.core.schema import parse_json  # deferred: loads pydantic
    from difftest.core.spec import CaseSpec  # deferred: with session, above

    try:
        data = parse_json(text)
    except ValueError as exc:  # malformed, nested past the parser's depth, or a key given twice
        raise SpecError("--spec", text[:200], f"a JSON object ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise SpecError("--spec", text, "a JSON object of CaseSpec fields")
    try:
        return CaseSpec.from_json(data)
    except SpecError as exc:
        raise SpecError(f"--spec {exc.field}", exc.value, exc.expected) from None


def _verdict_line(results: list[CaseResult], status: int) -> str:
    """--quiet's one line: 'FAIL: 46 results, 2 backends: torch PASS, aiter-triton-stage1 FAIL(mask)'."""
    from difftest.records import report  # deferred: with session, above

    verdicts = ", ".join(f"{s.backend} {s.verdict.value}" for s in report.summarize(results))
    head = "PASS" if status == ExitStatus.OK else "FAIL"
    return f"{head}: {len(results)} results: {verdicts or 'no backend ran'}"


def _print_outcome(request: RunRequest, outcome: RunOutcome, verbose: bool = False) -> None:
    """The shards (of a spread run), the table, the results per GPU, every result when `verbose`, the
    failures (every one, with whole tracebacks, when `verbose`), and where files went."""
    from difftest.engine import performance  # deferred: with session, above
    from difftest.records import report  # deferred: with session, above

    if outcome.shards:
        print("\n".join(shard.describe() for shard in outcome.shards) + "\n")
    print(report.render_table(report.summarize(outcome.results)))
    reach = report.render_reach(outcome.results, outcome.plan) if outcome.plan else ""
    if reach:
        print("\n" + reach)
    devices = report.render_devices(outcome.results)
    if devices:
        print(devices)
    siblings = performance.render_performance(performance.races(outcome.results))
    if siblings:
        print("\n" + siblings)
    if outcome.info.get("not_started"):
        print(f"\nbudget spent: {len(outcome.info['not_started'])} planned cases not started (listed in the report)")
    memory = _memory_line(outcome.results)
    if memory:
        print("\n" + memory)
    if verbose:
        print("\n" + report.render_results(outcome.results))
    failures = report.render_failures(outcome.results, limit=len(outcome.results) if verbose else 20,
                                      repro=outcome.repro, whole_tracebacks=verbose)
    if failures:
        print("\n" + failures)
    if request.report:
        print(f"\nreport: {request.report}")
    if outcome.stream:
        print(f"stream: {outcome.stream}")
    if outcome.bundles:
        print(f"\nreproducers: {outcome.bundles} bundle(s) under {request.repro_dir} (difftest replay BUNDLE; "
              "--trust-bundle for a backend given as package.module:object)")


def _memory_line(results: list) -> str:
    """One line on the calls memory shaped: tried again alone after running out beside others, run one at a
    time, SKIPs for want of memory ('' when none)."""
    noted = [r for r in results if r.memory is not None]
    retried = [r for r in noted if r.memory.retried]
    alone = sum(r.memory.alone for r in noted)
    skipped = sum(r.memory.ran_out for r in noted)
    if not retried and not alone:
        return ""
    passed = sum(not r.verdict.failed and r.verdict.value != "SKIP" for r in retried)
    return (f"memory: {len(retried)} calls ran out of memory beside others and were tried again alone ({passed} "
            f"passed there); {alone} calls ran one at a time; {skipped} SKIP for want of memory (reasons in the "
            "report)")


def _bundle_backend(args: argparse.Namespace, bundle: Bundle) -> Loaded:
    """The backend to replay or shrink a bundle through: --backends (one of the bundle's operation), else the
    recorded one."""
    from difftest.backends import get_backends  # deferred: loads torch
    from difftest.workflows.replay import bundle_backend  # deferred: loads torch

    if args.backends:
        return get_backends(list(args.backends), kind=bundle.operation)[0]
    return bundle_backend(bundle, trust=args.trust_bundle)


def cmd_replay(args: argparse.Namespace) -> int:
    """`difftest replay`: exit 1 when the bundle still fails."""
    from difftest.core.verdict import Verdict  # deferred: with the replay, below
    from difftest.workflows.replay import render_replay, replay  # deferred: loads torch

    bundle = _bundle_here(args.bundle)
    if bundle.operation != OperationKind.PAGED_LOGITS:
        from difftest.workflows.operation_session import replay_operation  # deferred: loads torch

        result = replay_operation(bundle, _bundle_backend(args, bundle))
    else:
        result = replay(bundle, _bundle_backend(args, bundle), isolate=args.isolate)  # type: ignore[arg-type]
    print(render_replay(bundle, result))
    if result.verdict == Verdict.SKIP:
        print(f"difftest: error: the replay tested nothing: {result.backend} skipped the case here: {result.reason}",
              file=sys.stderr)
    return ExitStatus.FAILED if result.verdict.failed or result.verdict == Verdict.SKIP else ExitStatus.OK


def _bundle_here(path: Path) -> Bundle:
    """The bundle at `path`, when this machine has the device it was recorded on (SpecError otherwise)."""
    from difftest.core.hardware import require_device  # deferred: with the bundle, below
    from difftest.records.bundle import INFO_FILE, load_bundle  # deferred: loads torch

    bundle = load_bundle(path)
    require_device(bundle.config.device, f"{bundle.path / INFO_FILE} device")
    return bundle


def cmd_shrink(args: argparse.Namespace) -> int:
    """`difftest shrink`: the smallest case that fails the same way, as a new bundle."""
    from difftest.records.bundle import write_bundle  # deferred: loads torch
    from difftest.workflows.shrink import shrink  # deferred: loads torch

    bundle = _bundle_here(args.bundle)
    if bundle.operation != OperationKind.PAGED_LOGITS:
        return _shrink_operation(args, bundle)
    backend = _bundle_backend(args, bundle)
    found = shrink(bundle, backend, bundle.config, args.seconds)
    folder = write_bundle(args.out or bundle.path.parent, found.case, found.result, bundle.config, backend.origin,
                          backend.contract.library, field="--out" if args.out else "bundle")
    print(f"{found.summary(backend.origin.target or backend.name, bundle.config)}\nbundle: {folder}")
    return ExitStatus.OK


def _shrink_operation(args: argparse.Namespace, bundle: Bundle) -> int:
    """`difftest shrink` of a bundle of an operation other than paged logits."""
    from difftest.records.bundle import write_bundle  # deferred: loads torch
    from difftest.workflows.operation_session import shrink_operation  # deferred: loads torch

    backend = _bundle_backend(args, bundle)
    found = shrink_operation(bundle, args.seconds, backend)
    folder = write_bundle(args.out or bundle.path.parent, found.case, found.result, bundle.config, backend.origin,
                          found.result.library,
                          field="--out" if args.out else "bundle")
    violated = "".join(f"\n    metamorphic: {violation.describe()}" for violation in found.result.metamorphic)
    print(f"shrunk {bundle.case.describe()}\n    to {found.case.describe()}: {found.result.verdict.value}: "
          f"{found.result.headline}{violated}\nbundle: {folder}")
    return ExitStatus.OK


# The modules of the matrix extra each command imports, and their distributions.
MATRIX_EXTRA = {"emit": {"yaml": "PyYAML"}, "merge": {"matplotlib": "matplotlib"}}


def cmd_matrix(args: argparse.Namespace) -> int:
    """`difftest matrix plan|emit|run|merge`; without the matrix extra a command that needs it is one line
    naming what to install."""
    missing = [name for module, name in MATRIX_EXTRA.get(args.matrix_command, {}).items()
               if importlib.util.find_spec(module) is None]
    if missing:
        print(f"difftest: error: `difftest matrix {args.matrix_command}` needs {', '.join(missing)}, which is not "
              "installed: pip install 'difftest[matrix]'", file=sys.stderr)
        return ExitStatus.USAGE
    actions = {"plan": _matrix_plan, "emit": _matrix_emit, "run": _matrix_run, "merge": _matrix_merge}
    return actions[args.matrix_command](args)


def _matrix_plan(args: argparse.Namespace) -> int:
    from difftest.matrix import cell as matrix_cell  # deferred: loads torch (the backends' contracts)
    from difftest.matrix.definition import load_matrix

    print(matrix_cell.plan_matrix(load_matrix(args.file)).render())
    return ExitStatus.OK


def _matrix_emit(args: argparse.Namespace) -> int:
    from difftest.core.files import atomic_write  # deferred: with the matrix, below
    from difftest.matrix import cell as matrix_cell  # deferred: loads torch (the backends' contracts)
    from difftest.matrix import emit as matrix_emit  # deferred: with the cell, above
    from difftest.matrix.definition import load_matrix
    from difftest.matrix.outputs import output_file  # deferred: with the matrix, above

    target = output_file(args.output, "output") if args.output is not None else None  # before the planning
    text = matrix_emit.emit(matrix_cell.plan_matrix(load_matrix(args.file)), args.system)
    if target is None:
        print(text, end="")
    else:
        print(f"{args.system.value}: {atomic_write(target, text, 'output')}")
    return ExitStatus.OK


def _matrix_run(args: argparse.Namespace) -> int:
    """Status 0 once the cell's report is written, whatever its verdicts: the merge gates on them."""
    from difftest.matrix import cell as matrix_cell  # deferred: loads torch and the runner
    from difftest.records import report  # deferred: loads torch and the runner

    made = matrix_cell.run_cell(args.file, args.cell, args.out)
    print(report.render_table(report.summarize(made.results)))
    failures = report.render_failures(made.results)
    if failures:
        print("\n" + failures)
    print(f"\nreport: {made.report}\njunit: {made.junit}")
    return ExitStatus.OK


def _matrix_merge(args: argparse.Namespace) -> int:
    from difftest.matrix import merge as matrix_merge  # deferred: loads torch (results) and matplotlib
    from difftest.matrix.outputs import output_folder  # deferred: with the merge, above
    from difftest.records.ledger import load_ledger

    output_folder(args.out, "out")  # before the reports are read
    merged = matrix_merge.merge(args.reports, load_ledger(args.ledger) if args.ledger else None, args.baseline)
    written = matrix_merge.write_outputs(merged, args.out)
    print(matrix_merge.render_markdown(merged))
    print("\n".join(f"wrote {path}" for path in written))
    return merged.status


def cmd_fuzz(args: argparse.Namespace) -> int:
    """`difftest fuzz`: exit 1 when the campaign found a failure."""
    if args.op != OperationKind.PAGED_LOGITS:
        return _fuzz_operation(args)
    from difftest.generators.regime import Regime  # deferred: with the campaign, below
    from difftest.records import report  # deferred: loads torch and the runner
    from difftest.workflows import fuzz  # deferred: loads torch and the runner

    regime = Regime(max_batch=args.max_batch, max_context=args.max_context, heads=args.heads,
                    head_dim=args.head_dim, block_size=args.block_size)
    relations = _relations(args.op, args.metamorphic)
    # A batch's passing members are judged on its rows alone: relations need each case launched by itself.
    batching = args.batching if args.batching is not None else not relations
    campaign = fuzz.Campaign(budget=args.budget, backends=_backend_names(args), until_failures=args.until_failures,
                             seed=args.seed, repro_dir=args.repro_dir, stream=args.stream,
                             shrink_seconds=args.shrink_seconds, regime=regime, batching=batching,
                             jobs=1 if args.jobs is None else args.jobs,
                             config=_run_config(args, metamorphic=relations), report=args.report, junit=args.junit,
                             argv=tuple(args.argv))
    progress = _CampaignProgress(args.budget, enabled=not (args.no_progress or args.quiet) and sys.stderr.isatty())
    try:
        outcome = fuzz.fuzz(campaign, on_progress=progress.step)
    finally:
        progress.close()
    if not args.quiet:  # quiet: the campaign's lines alone, its verdict and a repro line per failure
        print(report.render_table(report.summarize(outcome.results)))
        print("\n" + report.render_reach(outcome.results))
    if args.verbose:
        print("\n" + report.render_results(outcome.results))
    print(("" if args.quiet else "\n") + fuzz.render_campaign(outcome))
    if outcome.temporary:
        print("(--repro-dir DIR keeps the bundles where you say)")
    for field, path in outcome.written.items():
        print(f"{field}: {path}")
    return ExitStatus.FAILED if outcome.found or outcome.lost_jobs else ExitStatus.OK


def _fuzz_operation(args: argparse.Namespace) -> int:
    """`difftest fuzz --op X` for an operation other than paged logits: exit 1 when it found a failure."""
    from difftest.workflows.operation_session import OperationCampaign, fuzz_operation  # deferred: loads torch

    refused(args)
    campaign = OperationCampaign(operation=args.op, budget=args.budget, seed=args.seed, backends=_backend_names(args),
                                 config=_run_config(args, metamorphic=_relations(args.op, args.metamorphic)),
                                 repro_dir=args.repro_dir, report=args.report,
                                 stream=args.stream, junit=args.junit, until_failures=args.until_failures,
                                 argv=tuple(args.argv))
    outcome = fuzz_operation(campaign)
    _print_operation(outcome.results, args.verbose, args.quiet)
    print(f"\n{args.op.value} fuzz: {len(outcome.results)} results, {sum(r.verdict.failed for r in outcome.results)} "
          f"failing" + (f", {outcome.bundles} bundle(s) under {args.repro_dir}" if outcome.bundles else ""))
    for field in ("stream", "report", "junit"):
        if field in outcome.written:
            print(f"{field}: {outcome.written[field]}")
    return ExitStatus.FAILED if outcome.failed else ExitStatus.OK


def cmd_selftest(args: argparse.Namespace) -> int:
    """`difftest selftest`: exit 1 unless every expected catch happened and the mutants that must pass passed."""
    from difftest.generators.regime import Regime  # deferred: with the selftest, below
    from difftest.workflows import selftest  # deferred: loads torch, triton and the runner

    regime = Regime(max_batch=args.max_batch, max_context=args.max_context, heads=args.heads,
                    head_dim=args.head_dim, block_size=args.block_size)
    relations = _relations(OperationKind.PAGED_LOGITS, args.metamorphic)  # selftest's relations: its paged cases'
    request = selftest.SelftestRequest(config=_run_config(args, metamorphic=relations),
                                       template=args.backend_template, budget=args.budget, seed=args.seed,
                                       mutants=args.mutants, regime=regime, case_filter=tuple(args.case_filter),
                                       plan=not args.fuzz_only, report=args.report, argv=tuple(args.argv))
    outcome = selftest.selftest(request, progress=None if args.quiet else lambda line: print(line, flush=True))
    print(outcome.summary() if args.quiet else "\n" + selftest.render_scores(outcome))
    if args.verbose:
        print("\n" + selftest.render_left_out(outcome))
    if outcome.written:
        print(f"report: {outcome.written}")
    return outcome.status


def _run_config(args: argparse.Namespace, **more: object) -> RunConfig:
    """The RunConfig of the options that feed and guard backends (_add_feeding, --device, --oracle), with
    `more` of the command's own (`run`'s sanitizer and timing)."""
    from difftest.engine.config import RunConfig  # deferred: loads torch

    return RunConfig(device=args.device.value, encoding=args.encoding, layout=args.layout, isolate=args.isolate,
                     timeout=args.timeout, repeat=args.repeat, oracle=args.oracle,
                     startup_timeout=args.startup_timeout, **more)  # type: ignore[arg-type]


class _CampaignProgress:
    """tqdm's bar on stderr for a campaign: the budget's seconds spent, cases drawn, signatures found and
    what it is doing. Drawn only when `enabled` (on a terminal); it goes when the campaign ends."""

    def __init__(self, budget: float, enabled: bool) -> None:
        self.budget, self.enabled = budget, enabled
        self.bar: tqdm | None = None

    def step(self, where: Progress) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm  # deferred: only a terminal draws it

            # The raw stream: the bar redraws itself with carriage returns, which the printable one escapes.
            self.bar = tqdm(total=round(self.budget, 1), unit="s", file=_raw(sys.stderr), dynamic_ncols=True,
                            leave=False,
                            mininterval=0, bar_format="fuzz {bar} {n:.0f}/{total:.0f} s{postfix}")
        cases = "" if where.cases is None else f"{where.cases} cases, "
        self.bar.n = min(round(where.seconds, 1), self.bar.total)
        self.bar.set_postfix_str(printable(f"{cases}{where.signatures} signatures, {where.doing}", lines=False))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Progress:
    """tqdm's bar on stderr: results made of those planned, the case last reported, and an ETA. Drawn
    only when `enabled` (on a terminal); it goes when the run ends (leave=False), the table stays."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: tqdm | None = None

    def planned(self, total: int) -> None:
        if self.enabled:
            from tqdm import tqdm  # deferred: only a terminal draws it

            # Redrawn at every result (mininterval=0): a result takes far longer than a redraw.
            self.bar = tqdm(total=total, unit="result", file=_raw(sys.stderr), dynamic_ncols=True, leave=False,
                            mininterval=0)

    def step(self, result: CaseResult) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(printable(f"{result.backend} on {result.case}", lines=False), refresh=False)
            self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


if __name__ == "__main__":
    sys.exit(main())
