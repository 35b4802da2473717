"""Known divergences: which (backend, case) results are expected to fail, each entry citing its issue.

A ledger is a TOML file of `[[divergence]]` tables:

    [[divergence]]
    backend = "aiter-triton-fused"    # fnmatch pattern on the backend name
    case = "block-boundaries-*"       # fnmatch pattern on the case name
    spec = { next_n = 2 }             # optional: spec fields the case must have (strings are fnmatch patterns)
    reason = "window end off by one when L % block_size == 0"
    issue = "ROCm/aiter#4244"         # required: a URL or owner/repo#N

A failing result that an entry matches is expected (the pytest plugin reports it as xfail with the
reason and the issue); a matching result that passes means the divergence is gone, and the entry
must go with it. Python 3.10 reads TOML through the `tomli` package (3.11+ has tomllib).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import Path
from typing import Any

from difftest.errors import SpecError, require
from difftest.result import CaseResult
from difftest.schema import LedgerModel, read_text, validate

REQUIRED = ("backend", "case", "reason", "issue")
MAX_LEDGER_BYTES = 1 << 24


@dataclasses.dataclass(frozen=True)
class Divergence:
    """One known divergence: the results it covers, why they fail, and where that is tracked."""

    backend: str
    case: str
    reason: str
    issue: str
    spec: tuple[tuple[str, Any], ...] = ()  # (field, value or fnmatch pattern) the case's spec must have

    def matches(self, result: CaseResult) -> bool:
        """Whether `result` is one of this entry's (backend, case) pairs."""
        if not (fnmatch.fnmatchcase(result.backend, self.backend) and fnmatch.fnmatchcase(result.case, self.case)):
            return False
        if not self.spec:
            return True
        spec = result.spec or {}
        return all(field in spec and _field_matches(spec[field], want) for field, want in self.spec)

    def describe(self) -> str:
        """'backend::case (issue)', how messages name the entry."""
        return f"{self.backend}::{self.case} ({self.issue})"


@dataclasses.dataclass(frozen=True)
class Ledger:
    """Every entry of one ledger file, in file order."""

    path: Path
    entries: tuple[Divergence, ...]

    def find(self, result: CaseResult) -> Divergence | None:
        """The first entry matching `result`, or None."""
        return next((entry for entry in self.entries if entry.matches(result)), None)


def load_ledger(path: str | Path) -> Ledger:
    """Read and check a ledger file against difftest.schema.LedgerModel; SpecError names the first field
    that is wrong ('divergence[2].issue')."""
    path = Path(path)
    require(path.is_file(), "ledger", str(path), "an existing TOML file")
    toml = _toml_module(path)
    text = read_text(path, "ledger", "TOML file", MAX_LEDGER_BYTES)
    try:
        document = toml.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, or an integer past str()'s digits
        raise SpecError("ledger", str(path), f"valid TOML ({exc})") from None
    validate(LedgerModel, document, root="ledger")
    return Ledger(path, tuple(_entry(table) for table in document.get("divergence", [])))


def _entry(table: dict[str, Any]) -> Divergence:
    """The Divergence of a table that fits schema.DivergenceModel."""
    spec = table.get("spec", {})
    return Divergence(backend=table["backend"], case=table["case"], reason=table["reason"],
                      issue=table["issue"].strip(), spec=tuple(sorted(spec.items())))


def _field_matches(value: Any, want: Any) -> bool:
    if isinstance(want, str):
        return fnmatch.fnmatchcase(str(value), want)
    return value == want


def _toml_module(path: Path) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SpecError("ledger", str(path), "a TOML file, which Python 3.10 reads with tomli "
                            "(pip install tomli)") from None
    return tomllib
