"""The CI matrix: device kinds x library versions x backends x suites, read from a difftest.toml
([matrix]) or a pyproject.toml ([tool.difftest.matrix]), and planned into cells.

A cell is one CI job: one device kind, one library version, one suite, and the backends that run
there. A combination (device, backend, version, suite) is left out, with its reason, when the
backend's contract does not take the device kind (its `devices` and `archs` against the kind's facts
in difftest.core.hardware), when the version does not provide the backend, or when an exclude rule
matches it and no include rule does (an include rule is an exception to the exclude rules, never to
the facts). The file also says how the CI jobs install difftest itself ([matrix.difftest]: a release,
a git URL or a wheel; difftest.matrix.emit writes the pip command). docs/matrix.md describes the file.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field, model_validator

from difftest.core.errors import SpecError, require
from difftest.core.hardware import DeviceKind
from difftest.core.kinds import CaseKind, OperationKind
from difftest.core.schema import (
    MAX_NAME,
    MAX_TEXT,
    Bool,
    Checked,
    Expect,
    Filled,
    Int,
    ListOf,
    Member,
    Model,
    Number,
    OneOf,
    Record,
    Seed,
    Text,
    TupleOf,
    read_toml,
    shown,
    validate,
)
from difftest.core.schema import Rule as Check
from difftest.core.spec import CaseSpec

if TYPE_CHECKING:
    from difftest.core.contract import Contract

FILES = ("difftest.toml", "pyproject.toml")  # where the matrix is looked for when no file is given
FILE_FIELD = "matrix_file"  # the library parameter naming the file (the CLI's --file)

MAX_MATRIX_ITEMS = 256  # entries of one axis or rule list: a matrix past this is not one CI can run
MAX_SUITE_SECONDS = 7 * 86400  # a suite's budget; a week is far past any CI job's limit
MATRIX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MATRIX_NAME_TEXT = "a name of 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
# A pinned wheel: 'distribution==version' (PEP 508 name, PEP 440 version characters), extras allowed.
PINNED = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(\[[A-Za-z0-9._,-]*\])?==([A-Za-z0-9.+!_-]+)")

# difftest itself, as a CI job installs it ([matrix.difftest]): a release's version (PEP 440, public), a git
# URL pip can clone and a ref in it, or a wheel file. Each goes into a shell command (quoted) and a pip
# requirement, so none may hold what pip would read as another part of it ('@', '#', ';', a space).
RELEASE = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")
GIT_URL = re.compile(r"(git\+)?(https?|ssh|file)://[^\s@#;]+(@[^\s@#;/]+/[^\s@#;]+)?|git@[^\s@#;]+:[^\s@#;]+")
GIT_REF = re.compile(r"[A-Za-z0-9._/-]{1,255}")
MatrixName = Check(lambda v: type(v) is str and MATRIX_NAME.fullmatch(v) is not None, MATRIX_NAME_TEXT).type(str)
Pattern = Filled("an fnmatch pattern (a non-empty string)")
Patterns = ListOf(Pattern, MAX_MATRIX_ITEMS, f"a list of 1 to {MAX_MATRIX_ITEMS} fnmatch patterns", low=1)
Labels = Check(lambda v: (type(v) is str and v.strip() != "" and len(v) <= MAX_NAME) or (
    type(v) is list and 1 <= len(v) <= 16 and all(type(x) is str and x.strip() != "" for x in v)),
    "a runner label, or a list of 1 to 16 labels").type()


class Source(str, enum.Enum):
    """Where a library version comes from."""

    WHEEL = "wheel"  # a pinned distribution the CI job pip-installs before the cell runs
    PATH = "path"  # a folder put first on sys.path and PYTHONPATH: a source checkout, an unpacked tree
    INSTALLED = "installed"  # whatever the job's environment has


class Install(str, enum.Enum):
    """Where a CI job installs difftest itself from ([matrix.difftest]), always with its matrix extra."""

    VERSION = "version"  # a release from the package index: difftest[matrix]==VERSION
    GIT = "git"  # a git URL, at a ref when one is given: difftest[matrix] @ git+URL@REF
    WHEEL = "wheel"  # a wheel file in the repository (built by an earlier step, or committed)


@dataclasses.dataclass(frozen=True)
class DifftestSource:
    """How the jobs install difftest: `target` is the version, the git URL, or the wheel's path as the
    matrix file gives it (relative to the file)."""

    how: Install
    target: str
    ref: str | None = None


@dataclasses.dataclass(frozen=True)
class Runner:
    """A device kind and where its CI jobs run."""

    kind: DeviceKind
    labels: tuple[str, ...]  # GitHub Actions `runs-on`
    queue: str  # the Buildkite agent queue


@dataclasses.dataclass(frozen=True)
class Version:
    """A library version: a pinned wheel, a folder, or the installed environment."""

    name: str
    source: Source
    target: str | None  # the requirement of a wheel, the folder of a path (as the file gives it)
    backends: tuple[str, ...]  # fnmatch patterns of the backends it provides
    pip_args: tuple[str, ...] = ()

    def provides(self, backend: str) -> bool:
        """Whether this version provides `backend` (a name as the matrix lists it)."""
        return any(fnmatch.fnmatchcase(backend, pattern) for pattern in self.backends)

    def describe(self) -> str:
        """'vllm==0.33.0', 'path vendor/aiter', or 'installed'."""
        if self.source == Source.PATH:
            return f"path {self.target}"
        return self.target if self.source == Source.WHEEL and self.target else Source.INSTALLED.value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Suite(Record):
    """Which cases a cell runs: a `difftest run` suite, or a fuzz campaign of `budget` seconds. One
    [matrix.suites.NAME] table, its one definition: its fields, defaults and bounds, and its NAME."""

    what = "a table of suite fields"
    name: MatrixName = dataclasses.field(default="", init=False)  # the table's NAME, not one of its keys (named)
    cases: Member(CaseKind) = CaseKind.ENVELOPE
    count: Int(1, 1000) | None = None
    seed: Seed = 0
    budget: Number(1.0, MAX_SUITE_SECONDS) | None = None  # seconds
    # One CaseSpec as JSON, as `--spec` takes it; left out of ==/hash (a dict has none): names are unique.
    spec: Checked(CaseSpec) | None = dataclasses.field(default=None, compare=False)
    case_filter: TupleOf(Pattern, MAX_MATRIX_ITEMS, "a list of fnmatch patterns") = ()
    fuzz: Bool = False  # a `difftest fuzz` campaign of `budget` seconds instead of a run
    isolate: Bool | None = None
    selftest: Bool = False  # the cell also scores the mutants in its first backend's envelope (difftest selftest)
    op: Member(OperationKind) = OperationKind.PAGED_LOGITS  # the operation whose backends the suite runs

    def named(self, name: str) -> Suite:
        """This suite, called `name` (its table's NAME)."""
        suite = dataclasses.replace(self)
        object.__setattr__(suite, "name", name)  # a field the table cannot give: not an __init__ argument
        return suite

    def checked(self) -> None:
        """A fuzz suite has its budget; an operation's suite none of a paged one's options (`run --op` refuses them
        too: they would be left unread)."""
        if self.fuzz and self.budget is None:
            raise SpecError("budget", None, "a number of seconds: a fuzz suite runs for its budget")
        if self.op != OperationKind.PAGED_LOGITS:
            for field, given in (("spec", self.spec is not None), ("case_filter", bool(self.case_filter))):
                if given:
                    raise SpecError(field, shown(getattr(self, field)), f"a paged-logits suite (op = "
                                    f"{self.op.value!r} runs its operation's own cases: leave {field} out)")


@dataclasses.dataclass(frozen=True)
class Combo:
    """One point of the product of the axes."""

    device: DeviceKind
    backend: str
    version: str
    suite: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Include(Record):
    """One [[matrix.include]] table: fnmatch patterns over the axes; the combinations they match run even
    where an exclude rule matches them."""

    what = "a table of fnmatch patterns {device, backend, version, suite}"
    device: Pattern = "*"
    backend: Pattern = "*"
    version: Pattern = "*"
    suite: Pattern = "*"

    def matches(self, combo: Combo) -> bool:
        """Whether every pattern matches its axis of `combo`."""
        pairs = ((self.device, combo.device.value), (self.backend, combo.backend), (self.version, combo.version),
                 (self.suite, combo.suite))
        return all(fnmatch.fnmatchcase(value, pattern) for pattern, value in pairs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exclude(Include):
    """One [[matrix.exclude]] table: combinations not run, and why."""

    what = "a table {device, backend, version, suite, reason}"
    reason: Filled("a non-empty string: why these combinations are not run", MAX_TEXT)


@dataclasses.dataclass(frozen=True)
class Matrix:
    """A matrix file, read and checked. Paths in it are relative to its folder."""

    path: Path
    runners: tuple[Runner, ...]
    backends: tuple[str, ...]
    versions: tuple[Version, ...]
    suites: tuple[Suite, ...]
    include: tuple[Include, ...] = ()
    exclude: tuple[Exclude, ...] = ()
    ledger: str | None = None
    baseline: str | None = None
    difftest: DifftestSource | None = None  # None: the version of difftest that emits the CI files
    setup: tuple[str, ...] = ()  # shell commands every cell's job runs once difftest is installed
    merge_runner: tuple[str, ...] = ("ubuntu-latest",)

    def resolve(self, relative: str) -> Path:
        """A path the file gives, relative to the file's folder."""
        return Path(os.path.normpath(self.path.parent / relative))


class Why(str, enum.Enum):
    """Why a combination is not run."""

    ARCH = "arch unsupported"  # the backend's contract does not take the device kind
    VERSION = "version lacks the backend"  # the version does not provide it
    RULE = "excluded"  # an exclude rule matched it


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """A (device, backend, version) not run in `suites` (every suite when empty), and why."""

    device: DeviceKind
    backend: str
    version: str
    why: Why
    reason: str
    suites: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Cell:
    """One CI job: a device kind, a version, a suite and the backends run there."""

    runner: Runner
    version: Version
    suite: Suite
    backends: tuple[str, ...]

    @property
    def name(self) -> str:
        """'sm90/vllm-0.33.0/quick': what `difftest matrix run` takes."""
        return f"{self.runner.kind.value}/{self.version.name}/{self.suite.name}"

    @property
    def slug(self) -> str:
        """The name as a CI job id and artifact name take it: 'sm90_vllm-0_33_0_quick'."""
        return re.sub(r"[^A-Za-z0-9_-]", "_", self.name)


@dataclasses.dataclass(frozen=True)
class MatrixPlan:
    """The cells of a matrix, and every combination left out with its reason."""

    matrix: Matrix
    cells: tuple[Cell, ...]
    excluded: tuple[Exclusion, ...]

    def cell(self, name: str) -> Cell:
        """The cell called `name`; SpecError listing the cells otherwise."""
        found = next((cell for cell in self.cells if cell.name == name), None)
        require(found is not None, "cell", name, f"a cell of {self.matrix.path}, one of {[c.name for c in self.cells]}")
        assert found is not None
        return found

    def render(self) -> str:
        """What `difftest matrix plan` prints: the cells with their backends, then what is left out and why."""
        lines = [f"{len(self.cells)} cells ({self.matrix.path})"]
        lines += [f"  {cell.name:<40} runner {'/'.join(cell.runner.labels)}, {cell.version.describe()}: "
                  f"{', '.join(cell.backends)}" for cell in self.cells]
        if self.excluded:
            lines.append(f"{len(self.excluded)} left out (device kinds that share a reason on one line)")
            lines += [f"  {line}" for line in self._grouped()]
        return "\n".join(lines)

    def _grouped(self) -> list[str]:
        """One line per (version, backend, suites, reason), its device kinds joined."""
        devices: dict[tuple[str, str, tuple[str, ...], Why, str], list[str]] = {}
        for e in self.excluded:
            devices.setdefault((e.version, e.backend, e.suites, e.why, e.reason), []).append(e.device.value)
        return [f"{','.join(kinds)}/{version} {backend} ({', '.join(suites) or 'every suite'}): {why.value}: {reason}"
                for (version, backend, suites, why, reason), kinds in devices.items()]


# --------------------------------------------------------------------------- reading the file

class MatrixDeviceModel(Model):
    """One [matrix.devices.KIND] table: where the CI jobs of that device kind run."""

    what: ClassVar[str] = "a table {runner, queue}"
    runner: Labels  # GitHub Actions `runs-on`
    queue: Filled("a Buildkite agent queue (a non-empty string)") | None = None  # default: the runner label


class MatrixVersionModel(Model):
    """One [matrix.versions.NAME] table: a library version the backends it provides run under."""

    what: ClassVar[str] = "a table {wheel or path, backends, pip_args}"
    wheel: Check(lambda v: type(v) is str and PINNED.fullmatch(v) is not None,
                "a pinned requirement 'distribution==version'").type(str) | None = None
    path: Filled("a folder (a source checkout or an unpacked tree)") | None = None
    backends: Patterns = Field(default_factory=lambda: ["*"])
    pip_args: ListOf(Text(256), 16, "a list of at most 16 pip options, e.g. ['--no-deps']") = Field(
        default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> MatrixVersionModel:
        if self.wheel is not None and self.path is not None:
            raise SpecError("path", self.path, "no path beside a wheel: a version is one wheel or one folder")
        if self.pip_args and self.wheel is None:
            raise SpecError("pip_args", self.pip_args, "no pip options without a wheel to install")
        return self


class MatrixDifftestModel(Model):
    """[matrix.difftest]: how every CI job installs difftest itself (with its matrix extra). At most one
    of version, git or wheel; none of them: the version of difftest that emits the CI files."""

    what: ClassVar[str] = "a table {version}, {git, ref} or {wheel}"
    version: Check(lambda v: type(v) is str and RELEASE.fullmatch(v) is not None,
                  "a difftest release, e.g. '0.1.0'").type(str) | None = None
    git: Check(lambda v: type(v) is str and len(v) <= MAX_NAME and GIT_URL.fullmatch(v) is not None,
              "a git URL pip can clone, e.g. 'https://github.com/ORG/difftest'").type(str) | None = None
    ref: Check(lambda v: type(v) is str and GIT_REF.fullmatch(v) is not None and not v.startswith("-"),
              "a branch, tag or commit of the git URL").type(str) | None = None
    wheel: Check(lambda v: type(v) is str and v.endswith(".whl") and v.strip() == v and len(v) <= MAX_NAME,
                "a wheel file (.whl), relative to the matrix file").type(str) | None = None

    @model_validator(mode="after")
    def _one_source(self) -> MatrixDifftestModel:
        given = [name for name in ("version", "git", "wheel") if getattr(self, name) is not None]
        if len(given) > 1:
            raise SpecError(given[1], getattr(self, given[1]), f"nothing beside {given[0]}: difftest is installed "
                            "from a version, a git URL or a wheel, one of them")
        if self.ref is not None and self.git is None:
            raise SpecError("ref", self.ref, "a ref only beside a git URL")
        return self


class MatrixModel(Model):
    """The CI matrix: [matrix] of a difftest.toml, or [tool.difftest.matrix] of a pyproject.toml."""

    what: ClassVar[str] = "a [matrix] table"
    devices: Annotated[dict[OneOf(DeviceKind), MatrixDeviceModel], Field(min_length=1),
                       Expect(f"a table of device kind -> {{runner}}, kinds among {[k.value for k in DeviceKind]}")]
    backends: ListOf(Filled("a registered backend name or 'package.module:object'"), MAX_MATRIX_ITEMS,
                     f"a list of 1 to {MAX_MATRIX_ITEMS} backend names", low=1)
    versions: Annotated[dict[MatrixName, MatrixVersionModel], Field(min_length=1, max_length=MAX_MATRIX_ITEMS),
                        Expect("a table of version name -> {wheel or path, backends}")] = Field(
        default_factory=lambda: {"installed": MatrixVersionModel()})  # the job's own environment
    suites: Annotated[dict[MatrixName, Suite], Field(min_length=1, max_length=MAX_MATRIX_ITEMS),
                      Expect("a table of suite name -> suite fields")]
    include: ListOf(Include, MAX_MATRIX_ITEMS, "an array of tables ([[matrix.include]])") = Field(
        default_factory=list)
    exclude: ListOf(Exclude, MAX_MATRIX_ITEMS, "an array of tables ([[matrix.exclude]])") = Field(
        default_factory=list)
    ledger: Filled("a ledger file (TOML)") | None = None
    baseline: Filled("a merged.json of an earlier merge") | None = None
    difftest: MatrixDifftestModel = Field(default_factory=MatrixDifftestModel)  # how CI installs difftest
    # run after installing difftest
    setup: ListOf(Text(MAX_NAME, 1), 16, "a list of at most 16 shell commands") = Field(default_factory=list)
    merge_runner: Labels = "ubuntu-latest"  # where the merge job runs



def load_matrix(path: str | Path | None = None) -> Matrix:
    """The matrix of `path` (a difftest.toml or a pyproject.toml), else of the first of FILES in the
    working folder that holds one; SpecError naming the first field that does not fit."""
    path = Path(path) if path is not None else _found()
    document = read_toml(path, FILE_FIELD, "matrix file (TOML)")
    prefix = "tool.difftest.matrix" if path.name == "pyproject.toml" else "matrix"
    table = _table(document, prefix.split("."))
    require(table is not None, f"{path} {prefix}", None, f"a [{prefix}] table")
    if prefix == "matrix":
        extra = sorted(set(document) - {"matrix"})
        require(not extra, f"{path} tables", extra, "only a [matrix] table")
    return _built(validate(MatrixModel, table, f"{path} {prefix}."), path)


def _found() -> Path:
    for name in FILES:
        path = Path(name)
        if path.is_file() and (name != "pyproject.toml" or _table(read_toml(path, FILE_FIELD, "TOML file"),
                                                                  ["tool", "difftest", "matrix"]) is not None):
            return path
    raise SpecError(FILE_FIELD, None, "a difftest.toml with a [matrix] table or a pyproject.toml with "
                    "[tool.difftest.matrix] in the working folder")


def _table(document: dict[str, Any], keys: list[str]) -> Any:
    for key in keys:
        if not isinstance(document, dict) or key not in document:
            return None
        document = document[key]
    return document


def _built(model: MatrixModel, path: Path) -> Matrix:
    runners = tuple(Runner(DeviceKind(kind), _labels(d.runner), d.queue or _labels(d.runner)[-1])
                    for kind, d in model.devices.items())
    return Matrix(
        path=path, runners=runners, backends=tuple(dict.fromkeys(model.backends)),
        versions=tuple(_version(name, v) for name, v in model.versions.items()),
        suites=tuple(suite.named(name) for name, suite in model.suites.items()),
        include=tuple(model.include), exclude=tuple(model.exclude),
        ledger=model.ledger, baseline=model.baseline, difftest=_difftest(model.difftest), setup=tuple(model.setup),
        merge_runner=_labels(model.merge_runner))


def _difftest(model: MatrixDifftestModel) -> DifftestSource | None:
    if model.git is not None:
        return DifftestSource(Install.GIT, model.git, model.ref)
    if model.wheel is not None:
        return DifftestSource(Install.WHEEL, model.wheel)
    return DifftestSource(Install.VERSION, model.version) if model.version is not None else None


def _labels(runner: str | list[str]) -> tuple[str, ...]:
    return (runner,) if isinstance(runner, str) else tuple(runner)


def _version(name: str, model: MatrixVersionModel) -> Version:
    source = Source.WHEEL if model.wheel else Source.PATH if model.path else Source.INSTALLED
    return Version(name, source, model.wheel or model.path, tuple(model.backends), tuple(model.pip_args))


# --------------------------------------------------------------------------- planning

def arch_reason(kind: DeviceKind, contract: Contract) -> str | None:
    """Why `contract` does not take `kind` (its devices, then its archs), or None when it does."""
    if kind.device not in contract.devices:
        return f"contract devices {list(contract.devices)} exclude {kind.device}"
    if kind.arch is not None and contract.archs is not None and kind.arch not in contract.archs:
        return f"contract archs {list(contract.archs)} exclude {kind.arch}"
    return None


def plan(matrix: Matrix, contracts: Mapping[str, Contract],
         operations: Mapping[str, OperationKind] | None = None) -> MatrixPlan:
    """The cells of `matrix`, given each backend's contract (by its name in the matrix) and operation (paged
    logits where `operations` does not say), and what is left out. A suite runs the backends of its own
    operation only; a (device, version, suite) with no backend left is no cell."""
    operations = operations or {}
    excluded: list[Exclusion] = []
    chosen: dict[tuple[Runner, Version, Suite], list[str]] = {}
    for runner, version, backend in itertools.product(matrix.runners, matrix.versions, matrix.backends):
        fact = _fact(runner.kind, backend, version, contracts[backend])
        left = [fact] if fact is not None else _ruled(matrix, runner.kind, backend, version)
        excluded += left
        gone = {suite for e in left for suite in e.suites or [s.name for s in matrix.suites]}
        for suite in matrix.suites:
            if suite.name not in gone and suite.op == operations.get(backend, OperationKind.PAGED_LOGITS):
                chosen.setdefault((runner, version, suite), []).append(backend)
    cells = tuple(Cell(*where, tuple(backends)) for where, backends in chosen.items())
    _unique_slugs(cells)
    return MatrixPlan(matrix, cells, tuple(excluded))


def _fact(kind: DeviceKind, backend: str, version: Version, contract: Contract) -> Exclusion | None:
    """The exclusion the facts make (arch first, then version), for every suite."""
    why = arch_reason(kind, contract)
    if why is not None:
        return Exclusion(kind, backend, version.name, Why.ARCH, why)
    if not version.provides(backend):
        return Exclusion(kind, backend, version.name, Why.VERSION,
                         f"{version.name} ({version.describe()}) provides {list(version.backends)}")
    return None


def _ruled(matrix: Matrix, kind: DeviceKind, backend: str, version: Version) -> list[Exclusion]:
    """One exclusion per exclude rule that takes suites of this (device, backend, version) out, with
    the suites it takes (those no include rule puts back)."""
    taken: dict[str, list[str]] = {}
    for suite in matrix.suites:
        combo = Combo(kind, backend, version.name, suite.name)
        if any(rule.matches(combo) for rule in matrix.include):
            continue
        rule = next((rule for rule in matrix.exclude if rule.matches(combo)), None)
        if rule is not None:
            taken.setdefault(rule.reason, []).append(suite.name)
    return [Exclusion(kind, backend, version.name, Why.RULE, reason, tuple(suites)) for reason, suites in taken.items()]


def _unique_slugs(cells: tuple[Cell, ...]) -> None:
    """Two cells whose names differ only where a CI id takes no character would share jobs and artifacts."""
    seen: dict[str, str] = {}
    for cell in cells:
        other = seen.setdefault(cell.slug, cell.name)
        require(other == cell.name, "versions", cell.name, f"names whose CI id differs from {other!r}'s "
                f"({cell.slug}): rename a version or a suite")
