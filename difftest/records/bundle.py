"""Reproducer bundles: everything needed to re-run one failing (backend, case) bit for bit.

A bundle is a folder holding case.npz (Case.save: the exact tensors) and bundle.json (BundleInfo: backend
and where it was loaded from, library versions, device, run config, verdict, first mismatch, and the
command that replays it; BundleInfo is both what write_bundle writes and what load_bundle reads). A
bundle is data: loading one imports nothing it names (docs/bundles.md says what replay does with the
recorded origin).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from difftest import __version__
from difftest.backends import Origin
from difftest.core.case import Case
from difftest.core.errors import OutputError, SpecError, require
from difftest.core.files import atomic_write, sync_folder
from difftest.core.kinds import (
    RELATIONS,
    AnyRelation,
    CacheLayout,
    Device,
    LengthEncoding,
    OperationKind,
    OracleKind,
)
from difftest.core.schema import (
    MAX_COMMAND,
    MAX_NAME,
    Bool,
    Float,
    Int,
    Member,
    Name,
    OneOf,
    Record,
    Rule,
    Text,
    TupleOf,
    one_line,
    parse_json,
    read_text,
    refuse_link,
    validate,
)
from difftest.core.verdict import Verdict
from difftest.engine.comparison import Comparison
from difftest.engine.config import MAX_REPEAT, MAX_STARTUP_TIMEOUT, RunConfig
from difftest.engine.result import CaseResult, Selection
from difftest.operations import operation
from difftest.records.commands import replay_command

CASE_FILE, INFO_FILE = "case.npz", "bundle.json"
MAX_BUNDLE_INFO_BYTES = 1 << 28  # bundle.json: a comparison lists its bad rows, up to one per row


# Every operation's relation names. A bundle keeps the names it recorded and reads them as its operation's
# relations (BundleInfo.config): the ragged operation's scale-q is not the paged operation's.
_NAMES = list(dict.fromkeys(r.value for kind in RELATIONS.values() for r in kind))
RelationName = Rule(lambda v: type(v) is str and v in _NAMES, f"one of {_NAMES}").type(str)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BundleInfo(Record):
    """bundle.json: the backend and where it was loaded from, the run's config (bundles written before a
    field of it existed replay with its default), the verdict, the case, the versions, and the command
    that replays it."""

    what = "a JSON object of bundle fields"
    backend: Name
    origin: Origin  # where the backend was loaded from when the bundle was written
    library: Text(MAX_NAME) = ""  # the backend's Contract.library
    # The operation it was tested in, its one-line judgement and a top-k stage's selection: written for an
    # operation other than paged logits (bundles written before operations are paged logits).
    operation: Member(OperationKind) = OperationKind.PAGED_LOGITS
    headline: Text() | None = None
    selection: Selection | None = None
    device: OneOf(Device)
    encoding_override: Member(LengthEncoding) | None = None
    layout_override: Member(CacheLayout) | None = None
    isolate: Bool | None = None  # RunConfig.isolate of the run that wrote it: where replay and shrink run it
    timeout: Float(0.0, math.inf) | None = None
    startup_timeout: Float(0.0, MAX_STARTUP_TIMEOUT) | None = None
    oracle: Member(OracleKind) | None = None
    repeat: Int(1, MAX_REPEAT) = 1
    # the names of the relations checked, its operation's (RunConfig.metamorphic; `relations` reads them)
    metamorphic: TupleOf(RelationName, 64, "a list of metamorphic relations") = ()
    verdict: Member(Verdict)
    reason: Text() | None = None
    comparison: Comparison | None = None
    case: Name
    description: Text() = ""
    torch: Text(MAX_NAME) = ""
    difftest: Text(MAX_NAME) = ""
    python: Text(MAX_NAME) = ""
    gpu: Text(MAX_NAME) | None = None  # where the result was computed (hardware.gpu_description)
    replay: Text(MAX_COMMAND) = ""

    @property
    def config(self) -> RunConfig:
        """The RunConfig the bundle's run fed the backend with."""
        default = RunConfig()
        return RunConfig(device=self.device, encoding=self.encoding_override, layout=self.layout_override,
                         isolate=self.isolate, timeout=self.timeout, oracle=self.oracle, repeat=self.repeat,
                         metamorphic=self.relations, startup_timeout=default.startup_timeout
                         if self.startup_timeout is None else self.startup_timeout)

    @property
    def relations(self) -> tuple[AnyRelation, ...]:
        """The relations checked, as members of the bundle's operation's enum."""
        kind = RELATIONS.get(self.operation)
        return tuple(kind(name) for name in self.metamorphic) if kind is not None else ()

    def checked(self) -> None:
        """The relations are those of the bundle's operation."""
        kind = RELATIONS.get(self.operation)
        known = [r.value for r in kind or ()]
        require(all(name in known for name in self.metamorphic), "metamorphic", list(self.metamorphic),
                f"relations of the {self.operation.value} operation: {known}")

    def dumped(self, out: dict[str, object]) -> dict[str, object]:
        """bundle.json; a paged-logits bundle without the operation's fields, as bundles were before operations."""
        if self.operation != OperationKind.PAGED_LOGITS:
            return out
        return {key: value for key, value in out.items() if key not in ("operation", "headline", "selection")}


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A loaded bundle: the case, how it was run, and what it gave then."""

    path: Path
    case: Case | Any  # the operation's own case (a Case for paged logits)
    info: BundleInfo

    @property
    def backend(self) -> str:
        """The backend's name when the bundle was written."""
        return self.info.backend

    @property
    def origin(self) -> Origin:
        """Where the backend was loaded from when the bundle was written."""
        return self.info.origin

    @property
    def config(self) -> RunConfig:
        """How the bundle's run fed the backend."""
        return self.info.config

    @property
    def verdict(self) -> Verdict:
        """What the backend gave on the case then."""
        return self.info.verdict

    @property
    def operation(self) -> OperationKind:
        """The operation its backend was tested in."""
        return self.info.operation


def bundle_name(result: CaseResult) -> str:
    """A folder name safe on every filesystem: backend and case."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{result.backend}--{result.case}")


def write_bundle(directory: str | Path, case: Case, result: CaseResult, config: RunConfig,
                 origin: Origin, library: str = "", field: str = "repro_dir") -> Path:
    """Write the bundle of `result` under `directory`; returns the bundle's folder.

    Atomically: the bundle is made in a hidden folder beside it, its files fsync'd, then renamed into
    place, so a folder of that name is always a whole bundle (an older one it replaces included).
    OutputError naming `field` when it cannot be written."""
    folder = Path(directory) / bundle_name(result)
    partial = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        case.save(partial / CASE_FILE)
        _fsync_file(partial / CASE_FILE)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise OutputError(field, folder, f"cannot write: {exc.strerror or exc}") from None
    info = BundleInfo(
        backend=result.backend, origin=origin, library=library, operation=result.operation, headline=result.headline,
        selection=result.selection, device=config.device, encoding_override=config.encoding,
        layout_override=config.layout, isolate=config.isolate, timeout=config.timeout,
        startup_timeout=config.startup_timeout, oracle=config.oracle_kind, repeat=config.repeat,
        metamorphic=tuple(relation.value for relation in config.metamorphic), verdict=result.verdict,
        reason=result.reason, comparison=result.comparison,
        case=case.name, description=case.describe(), torch=torch.__version__, difftest=__version__,
        python=platform.python_version(), gpu=result.gpu,  # where the result was computed, not where it is written
        replay=replay_command(folder, origin))
    try:
        atomic_write(partial / INFO_FILE, json.dumps(info.to_json(), indent=1) + "\n", field)
        _replace_folder(partial, folder)
    except OSError as exc:
        raise OutputError(field, folder, f"cannot write: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_folder(partial: Path, folder: Path) -> None:
    """Rename `partial` to `folder`; an older `folder` is moved aside first and removed after."""
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(folder, old)
    os.replace(partial, folder)
    sync_folder(folder.parent)
    shutil.rmtree(old, ignore_errors=True)


def load_bundle(path: str | Path) -> Bundle:
    """Read a bundle folder written by write_bundle.

    bundle.json is validated into its BundleInfo, then case.npz from its zip
    directory and array headers against its meta and the spec it was drawn from (Case.load) before
    anything is decompressed; the case's name must be the one bundle.json records. Anything that does
    not fit is one SpecError naming the file and the field ('.../bundle.json origin.target').
    """
    folder = Path(path)
    for name, what in ((INFO_FILE, "JSON object of bundle fields"), (CASE_FILE, "case archive")):
        refuse_link(folder / name, one_line(str(folder / name)), what)
    require((folder / INFO_FILE).is_file() and (folder / CASE_FILE).is_file(), "bundle", str(folder),
            f"a folder holding {CASE_FILE} and {INFO_FILE}")
    info_path = folder / INFO_FILE
    text = read_text(info_path, one_line(str(info_path)), "JSON file", MAX_BUNDLE_INFO_BYTES)
    try:
        info = parse_json(text)
    except ValueError as exc:  # named by its path, never quoted: what is no JSON may be anything
        raise SpecError(one_line(str(info_path)), str(info_path), f"a JSON object of bundle fields ({exc})") from None
    bundle = validate(BundleInfo, info, f"{info_path} ")
    case = operation(bundle.operation).load_case(folder / CASE_FILE)
    require(case.name == bundle.case, one_line(f"{info_path} case"), bundle.case,
            f"the name of the case in {CASE_FILE}, {case.name!r}")
    return Bundle(path=folder, case=case, info=bundle)
