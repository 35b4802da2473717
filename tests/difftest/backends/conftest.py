"""The field backends' real kernel files for the CPU tests: .device-deps/field/, as
scripts/prepare_field_deps.py writes it from the release wheels.

Once per session (and per xdist worker; the script serializes them on a lock file): files already
there with their pinned digests are kept, the rest are read from the wheels in the wheel cache or,
without them (CI), from the package index over HTTP range requests: about 8 MB in 1-2 s, against
some 700 MB of whole wheels. Where neither works (no network), the tests that need a file skip with
the script's reason.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

FIELD = REPO_ROOT / ".device-deps" / "field"


@pytest.fixture(scope="session")
def field_tree() -> Path:
    """.device-deps/field/ with every file of scripts/prepare_field_deps.RELEASES; a skip saying why not."""
    script = importlib.import_module("scripts.prepare_field_deps")
    try:
        script.prepare(FIELD)
    except script.FetchError as exc:
        pytest.skip(f"the field backends' kernel files could not be had: {exc}")
    return FIELD


@pytest.fixture
def on_path(field_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Puts a release folder of the field tree first on sys.path, as PYTHONPATH=.device-deps/field/<release>
    would, for this test only; returns the folder."""

    def put(release: str) -> Path:
        folder = field_tree / release
        monkeypatch.setattr(sys, "path", [str(folder), *sys.path])
        return folder

    return put
