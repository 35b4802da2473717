"""Kernel files carried without their package: which sys.path entry holds one, and which release it is.

Several libraries cannot be imported where difftest runs (vLLM, sglang: half a serving framework;
flag-gems: a device probe at import), yet the kernel a backend calls is one file of plain Python.
scripts/prepare_field_deps.sh copies such files out of the release wheels, each release in a folder
of its own whose paths are the wheel's (`vllm-0.34.0/vllm/models/...`), and that folder goes first on
PYTHONPATH, as every library version is chosen (docs/versions.md). A backend then finds its file here
and executes the few functions it needs from it (difftest.core.triton_interpret.load_kernel_defs).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

# `__version__ = '0.34.0'` (setuptools-scm also writes `__version__ = version = ...`), or a wheel's
# METADATA `Version: 5.0.2`.
_VERSION = re.compile(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]|^Version:\s*(\S+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class CarriedFile:
    """A kernel file found under a sys.path entry: the entry (`root`) and the file's path inside it."""

    root: Path
    relative: str

    @property
    def path(self) -> Path:
        """The file itself."""
        return self.root / self.relative

    def version(self, version_files: Sequence[str]) -> str | None:
        """The release, read as text from the first of `version_files` (paths or globs under the root)
        that names one; None when none does."""
        for pattern in version_files:
            for candidate in sorted(self.root.glob(pattern)):
                found = _VERSION.search(candidate.read_text(errors="replace"))
                if found:
                    return found.group(1) or found.group(2)
        return None


def find(relatives: Sequence[str], entries: Iterable[str] | None = None) -> CarriedFile | None:
    """The first of `entries` (sys.path by default; '' is the working directory) holding any of
    `relatives` (a file that moved between releases has several paths), or None."""
    for entry in sys.path if entries is None else entries:
        root = Path(entry or ".")
        for relative in relatives:
            if (root / relative).is_file():
                return CarriedFile(root.resolve(), relative)
    return None


def missing_reason(relatives: Sequence[str], release: str) -> str:
    """The reason a backend whose file no sys.path entry holds gives: where the file would come from."""
    return (f"no sys.path entry holds {' or '.join(relatives)}: scripts/prepare_field_deps.sh extracts it from "
            f"the {release} wheel into .device-deps/field/ (put that release's folder first on PYTHONPATH)")
