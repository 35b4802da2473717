"""Reproducer bundles: everything needed to re-run one failing (backend, case) bit for bit.

A bundle is a folder holding case.npz (Case.save: the exact tensors) and bundle.json (backend and
where it was loaded from, library versions, device, run config, verdict, first mismatch, and the
command that replays it). A bundle is data: loading one imports nothing it names
(docs/bundles.md says what replay does with the recorded origin).
"""

from __future__ import annotations

import dataclasses
import json
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
from difftest.core.kinds import CacheLayout, LengthEncoding, MetamorphicRelation, OperationKind, OracleKind
from difftest.core.schema import BundleInfoModel, one_line, parse_json, read_text, shown, validate
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.result import CaseResult
from difftest.operations import operation
from difftest.records.commands import replay_command
from difftest.records.serialize import to_jsonable

CASE_FILE, INFO_FILE = "case.npz", "bundle.json"
MAX_BUNDLE_INFO_BYTES = 1 << 28  # bundle.json: a comparison lists its bad rows, up to one per row


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A loaded bundle: the case, how it was run, and what it gave then."""

    path: Path
    case: Case | Any  # the operation's own case (a Case for paged logits)
    backend: str
    origin: Origin  # where the backend was loaded from when the bundle was written
    config: RunConfig
    verdict: Verdict
    info: dict[str, Any]
    operation: OperationKind = OperationKind.PAGED_LOGITS


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
    info = {
        "backend": result.backend, "origin": to_jsonable(origin), "library": library,
        **({} if result.operation == OperationKind.PAGED_LOGITS else
           {"operation": result.operation.value, "headline": result.headline,
            "selection": to_jsonable(result.selection)}),
        "device": config.device, "encoding_override": config.encoding.value if config.encoding else None,
        "layout_override": config.layout.value if config.layout else None,
        "isolate": config.isolate, "timeout": config.timeout, "startup_timeout": config.startup_timeout,
        "oracle": config.oracle_kind.value, "repeat": config.repeat,
        "metamorphic": [relation.value for relation in config.metamorphic],
        "verdict": result.verdict.value, "reason": result.reason,
        "comparison": to_jsonable(result.comparison), "case": case.name, "description": case.describe(),
        "torch": torch.__version__, "difftest": __version__, "python": platform.python_version(),
        "gpu": result.gpu,  # where the result was computed (hardware.gpu_description), not where it is written
        "replay": replay_command(folder, origin),
    }
    try:
        atomic_write(partial / INFO_FILE, json.dumps(info, indent=1) + "\n", field)
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

    bundle.json is checked against difftest.core.schema.BundleInfoModel, then case.npz from its zip
    directory and array headers against its meta and the spec it was drawn from (Case.load) before
    anything is decompressed; the case's name must be the one bundle.json records. Anything that does
    not fit is one SpecError naming the file and the field ('.../bundle.json origin.target').
    """
    folder = Path(path)
    require((folder / INFO_FILE).is_file() and (folder / CASE_FILE).is_file(), "bundle", str(folder),
            f"a folder holding {CASE_FILE} and {INFO_FILE}")
    info_path = folder / INFO_FILE
    text = read_text(info_path, one_line(str(info_path)), "JSON file", MAX_BUNDLE_INFO_BYTES)
    try:
        info = parse_json(text)
    except ValueError as exc:
        raise SpecError(one_line(str(info_path)), shown(text, 80), f"a JSON object of bundle fields ({exc})") from None
    validate(BundleInfoModel, info, f"{info_path} ")
    kind = OperationKind(info.get("operation", OperationKind.PAGED_LOGITS.value))
    case = operation(kind).load_case(folder / CASE_FILE)
    require(case.name == info["case"], one_line(f"{info_path} case"), info["case"],
            f"the name of the case in {CASE_FILE}, {case.name!r}")
    encoding, layout = info.get("encoding_override"), info.get("layout_override")
    oracle = info.get("oracle")
    config = RunConfig(device=info["device"], encoding=LengthEncoding(encoding) if encoding else None,
                       layout=CacheLayout(layout) if layout else None, isolate=info.get("isolate"),
                       timeout=info.get("timeout"), oracle=OracleKind(oracle) if oracle else None,
                       repeat=info.get("repeat", 1),
                       metamorphic=tuple(MetamorphicRelation(r) for r in info.get("metamorphic", ())),
                       startup_timeout=info.get("startup_timeout", RunConfig().startup_timeout))
    return Bundle(path=folder, case=case, backend=info["backend"],
                  origin=Origin(**info["origin"]), config=config, verdict=Verdict(info["verdict"]), info=info,
                  operation=kind)
