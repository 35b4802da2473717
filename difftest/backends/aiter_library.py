"""Finding AITER's Triton kernel files without importing aiter (its __init__ needs ROCm), and naming the release
found: shared by difftest.backends.aiter_triton (paged logits) and difftest.backends.aiter_ragged (ragged ones).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path

DISTRIBUTION = "amd-aiter"


def aiter_version() -> str | None:
    """The version of the aiter package found: its aiter/_version.py, else the distribution's
    metadata; None if neither.

    The package's own file first: a tree put first on sys.path (a source checkout, docs/versions.md)
    shadows an installed amd-aiter whose metadata would otherwise name the wrong version. A bare copy
    of the tree has no metadata, and its __init__ cannot be imported without ROCm, so _version.py is
    read as text.
    """
    package = aiter_dir()
    version_file = package / "_version.py" if package else None
    if version_file is not None and version_file.is_file():
        found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", version_file.read_text())
        if found:
            return found.group(1)
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def aiter_dir() -> Path | None:
    """The aiter package's folder, located by find_spec of the top-level package (which runs no
    aiter/__init__.py); None when there is none."""
    spec = importlib.util.find_spec("aiter")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def kernel_file(relatives: Sequence[str]) -> Path | None:
    """The first of `relatives` (paths inside the aiter package: a kernel moved between releases) that exists,
    or None when aiter or every one of them is missing."""
    package = aiter_dir()
    if package is None:
        return None
    return next((package / rel for rel in relatives if (package / rel).is_file()), None)


def library(path: Path | None) -> str:
    """'amd-aiter 0.1.7.post2.dev18 (FILE)': the version, and the kernel file it was loaded from (several trees
    may be on sys.path)."""
    version = aiter_version()
    name = f"{DISTRIBUTION} {version}" if version else f"{DISTRIBUTION} (version unknown or not installed)"
    return f"{name} ({path})" if path else name
