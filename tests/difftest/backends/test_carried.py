"""Kernel files found on sys.path without their package (difftest.backends.carried), with planted files:
only their paths and version files matter here."""

from __future__ import annotations

from pathlib import Path

from difftest.backends import carried

FILES = ("pkg/new/kernel.py", "pkg/old/kernel.py")


def plant(root: Path, relative: str, version_file: tuple[str, str] | None = None) -> Path:
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    (root / relative).touch()
    if version_file:
        (root / version_file[0]).parent.mkdir(parents=True, exist_ok=True)
        (root / version_file[0]).write_text(version_file[1])
    return root


def test_the_first_entry_holding_either_path_wins_whichever_path_it_holds(tmp_path):
    old = plant(tmp_path / "old", FILES[1])
    new = plant(tmp_path / "new", FILES[0])
    assert carried.find(FILES, [str(tmp_path / "empty"), str(old), str(new)]) == \
        carried.CarriedFile(old.resolve(), FILES[1])
    assert carried.find(FILES, [str(new), str(old)]).path == new.resolve() / FILES[0]
    assert carried.find(FILES, [str(tmp_path / "empty")]) is None


def test_the_version_comes_from_a_version_module_or_a_wheels_metadata(tmp_path):
    scm = plant(tmp_path / "a", FILES[0], ("pkg/_version.py", "__version__ = version = '0.34.0'\n"))
    metadata = plant(tmp_path / "b", FILES[0], ("pkg-5.0.2.dist-info/METADATA", "Name: pkg\nVersion: 5.0.2\n"))
    bare = plant(tmp_path / "c", FILES[0])
    assert carried.CarriedFile(scm, FILES[0]).version(("pkg/_version.py",)) == "0.34.0"
    assert carried.CarriedFile(metadata, FILES[0]).version(("pkg/_version.py", "pkg-*.dist-info/METADATA")) == "5.0.2"
    assert carried.CarriedFile(bare, FILES[0]).version(("pkg/_version.py",)) is None


def test_the_missing_reason_names_the_paths_the_release_and_the_script():
    assert carried.missing_reason(FILES, "pkg 1.0") == (
        "no sys.path entry holds pkg/new/kernel.py or pkg/old/kernel.py: scripts/prepare_field_deps.sh extracts "
        "it from the pkg 1.0 wheel into .device-deps/field/ (put that release's folder first on PYTHONPATH)")
