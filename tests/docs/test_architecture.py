"""docs/architecture.md names real paths: every folder, every module of a layer's row, every file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
CODE = re.compile(r"`([^`]+)`")


def _named_paths() -> list[Path]:
    """Paths the page names: `a/b` and `a/b.py` from the repository root, and each `name.py` of a table
    row relative to the row's folder (its first cell)."""
    paths = []
    for line in PAGE.read_text().splitlines():
        names = CODE.findall(line)
        folder = names[0] if line.startswith("| `") and names[0].endswith("/") else None
        for name in names:
            if "/" in name and " " not in name and not name.startswith(("package.", "a/")):
                paths.append(ROOT / name)
            elif folder and re.fullmatch(r"[\w]+\.py", name):
                paths.append(ROOT / folder / name)
    return paths


def test_every_path_the_architecture_page_names_exists():
    paths = _named_paths()
    assert len(paths) > 40, "the page names the layers' modules"
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_layer_folder_of_the_contract_has_a_row():
    text = PAGE.read_text()
    for folder in sorted(p.name for p in (ROOT / "difftest").iterdir() if p.is_dir() and p.name != "ledgers"
                         and not p.name.startswith("__")):
        assert f"`difftest/{folder}/`" in text, f"difftest/{folder}/ is a layer the page does not describe"
