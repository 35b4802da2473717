"""The `difftest` option group and the Settings read from it, checked once at configure time.

Reading the options imports neither torch nor difftest, except to check what needs them: a
`--difftest-device cuda` (is a GPU visible?) and the names in `--difftest-backends`.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from difftest.core import hardware
from difftest.core.kinds import ExitStatus, OperationKind

BACKENDS = "--difftest-backends"
SEED = "--difftest-seed"
CASES = "--difftest-cases"
DEVICE = "--difftest-device"
REPORT = "--difftest-report"
REPRO_DIR = "--difftest-repro-dir"
SUITE = "--difftest-suite"
LEDGER = "--difftest-ledger"
OP = "--difftest-op"

CASE_KINDS = ("random", "edges", "all", "envelope")
DEVICES = ("cpu", "cuda")
DEFAULT_CASES = "edges"
DEFAULT_COUNT = 2  # seeds per random spec when --difftest-cases names no count (per envelope spec: 1)
SEED_RANGE = 1_000_000  # a random seed is drawn below this, so case names stay short
OPTIONS = (BACKENDS, SEED, CASES, DEVICE, REPORT, REPRO_DIR, SUITE, LEDGER, OP)
DEFAULTS: dict[str, object] = {CASES: DEFAULT_CASES, DEVICE: "cpu", SUITE: False,
                               OP: OperationKind.PAGED_LOGITS.value}  # the others default to None
WRITTEN = (REPORT, REPRO_DIR)  # the options naming what the run writes: checked writable at configure time
WORKER_SEED = "difftest_seed"  # the workerinput key that carries the controller's seed to xdist workers


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every difftest option, parsed and checked."""

    backends: tuple[str, ...] | None  # names or 'package.module:object', as given; None: every registered one
    seed: int
    cases: str  # one of CASE_KINDS
    count: int  # seeds per random spec (per spec of an envelope plan)
    device: str
    report: Path | None
    repro_dir: Path | None
    suite: bool
    ledger: Path | None
    op: OperationKind = OperationKind.PAGED_LOGITS  # the operation the fixtures and the suite's items test

    def header(self) -> str:
        """The options that repeat this run, for the report header."""
        backends = f"{BACKENDS}={','.join(self.backends)}" if self.backends else "(every registered backend)"
        op = "" if self.op == OperationKind.PAGED_LOGITS else f" {OP}={self.op.value}"
        return f"difftest: {SEED}={self.seed} {CASES}={self.cases_text} {DEVICE}={self.device}{op} {backends}"

    @property
    def cases_text(self) -> str:
        """--difftest-cases as it would be given: 'edges', 'random:2', 'all:2', 'envelope'."""
        plain = self.cases == "edges" or (self.cases == "envelope" and self.count == 1)
        return self.cases if plain else f"{self.cases}:{self.count}"


def add_options(parser: pytest.Parser) -> None:
    """Register the `difftest` option group."""
    group = parser.getgroup("difftest", "differential testing of indexer kernels against the oracle")
    group.addoption(BACKENDS, metavar="NAMES",
                    help="comma-separated backends of --difftest-op's operation: registered names or "
                         "package.module:object, LOGITS+TOPK for an indexer (default: every registered backend)")
    group.addoption(SEED, metavar="N", help="seed of the generated cases (default: random, printed in the header)")
    group.addoption(CASES, metavar="KIND[:COUNT]", default=DEFAULT_CASES,
                    help=f"cases: random, edges or all (the operation's fixed suite), or envelope (each backend's "
                         f"cases inside its own contract); COUNT seeds per random spec (default: {DEFAULT_CASES}, "
                         f"count {DEFAULT_COUNT}; 1 per envelope spec)")
    group.addoption(DEVICE, default=DEFAULTS[DEVICE], help="cpu or cuda (default: cpu)")
    group.addoption(REPORT, metavar="PATH", help="write the JSON report of every checked result here")
    group.addoption(REPRO_DIR, metavar="DIR", help="write a reproducer bundle of every failure here")
    group.addoption(SUITE, action="store_true", default=DEFAULTS[SUITE], help="collect the built-in differential suite")
    group.addoption(LEDGER, metavar="PATH", help="TOML ledger of known divergences (xfail, each citing its issue)")
    group.addoption(OP, default=DEFAULTS[OP], metavar="NAME",
                    help=f"the operation the fixtures and --difftest-suite test: one of "
                         f"{', '.join(k.value for k in OperationKind)} (default: {DEFAULTS[OP]})")


def options_given(config: pytest.Config) -> bool:
    """Whether the command line sets any difftest option (then the run is a difftest run from the start)."""
    return any(config.getoption(option) != DEFAULTS.get(option) for option in OPTIONS)


def read_settings(config: pytest.Config) -> Settings:
    """The checked options; pytest.UsageError names the option, its value and what is allowed."""
    cases, count = _cases(config.getoption(CASES))
    return Settings(backends=_backends(config.getoption(BACKENDS)), seed=_seed(config),
                    cases=cases, count=count, device=_device(config.getoption(DEVICE)),
                    report=_path(config, REPORT, want_dir=False), repro_dir=_path(config, REPRO_DIR, want_dir=True),
                    suite=bool(config.getoption(SUITE)), ledger=_path(config, LEDGER, want_dir=False),
                    op=_op(config.getoption(OP)))


def usage_error(option: str, value: object, allowed: str) -> pytest.UsageError:
    """The one form of every option error: '--option=value: expected ...'."""
    return pytest.UsageError(f"{option}={value!r}: expected {allowed}")


def _backends(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise usage_error(BACKENDS, text, "comma-separated backend names or package.module:object, none empty")
    return names


def _seed(config: pytest.Config) -> int:
    """An xdist worker takes the controller's seed; otherwise the option's, or a fresh random one."""
    worker = getattr(config, "workerinput", None)
    if worker is not None and WORKER_SEED in worker:
        return int(worker[WORKER_SEED])
    text = config.getoption(SEED)
    if text is None:
        return random.Random().randrange(SEED_RANGE)
    if not text.isdigit():
        raise usage_error(SEED, text, "a non-negative integer")
    return int(text)


def _cases(text: str) -> tuple[str, int]:
    kind, colon, count = text.partition(":")
    if kind not in CASE_KINDS or (colon and not (count.isdigit() and int(count) >= 1)):
        raise usage_error(CASES, text, f"one of {', '.join(CASE_KINDS)}, optionally with :COUNT >= 1 (e.g. random:4)")
    return kind, int(count) if colon else 1 if kind == "envelope" else DEFAULT_COUNT


def _op(name: str) -> OperationKind:
    names = [kind.value for kind in OperationKind]
    if name not in names:
        raise usage_error(OP, name, f"one of {', '.join(names)}")
    return OperationKind(name)


def _device(name: str) -> str:
    if name not in DEVICES:
        raise usage_error(DEVICE, name, " or ".join(DEVICES))
    if name == "cuda":
        if hardware.cuda_unavailable_reason():
            raise usage_error(DEVICE, name, f"a device torch can see ({hardware.CUDA_UNAVAILABLE})")
    return name


def _path(config: pytest.Config, option: str, want_dir: bool) -> Path | None:
    """The option's path (from the invocation folder): a directory or not as `want_dir` says and, for what
    the run writes, writable (_writable); None when not given."""
    text = config.getoption(option)
    if text is None:
        return None
    path = config.invocation_params.dir / text
    try:
        wrong_kind = path.exists() and path.is_dir() != want_dir
    except OSError as exc:  # a name too long, a loop of links: the path cannot even be looked at
        if option in WRITTEN:
            _writable(option, text, path, folder=want_dir)
        raise usage_error(option, text, f"a path that can be looked at ({exc.strerror or exc})") from None
    if wrong_kind:
        raise usage_error(option, text, "a directory" if want_dir else "a file path, not a directory")
    if option in WRITTEN:
        _writable(option, text, path, folder=want_dir)
    return path


def _writable(option: str, text: str, path: Path, folder: bool) -> None:
    """End the run before any test (one line, exit status 3 as `difftest run` gives an output it cannot write)
    unless a file can be written at `path` (in the folder `path` when `folder`): a report lost at the session's
    end would be a traceback after every test ran."""
    from difftest.core.errors import OutputError  # deferred: the plugin loads without the library
    from difftest.core.files import check_writable  # deferred: the plugin loads without the library

    try:
        check_writable(path, option, folder=folder)
    except OutputError as exc:
        pytest.exit(f"{option}={text!r}: {exc.reason}", returncode=int(ExitStatus.IO))
