"""The architecture, checked: the layering contract in pyproject.toml (import-linter), no import
cycle even counting imports inside functions, deferred imports only where they defer something
heavy, and the light entry points staying light."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

# import-linter's graph library, a dev extra: a machine without it (the GPU image) skips these, CI has it
grimp = pytest.importorskip("grimp", reason="grimp (import-linter's graph library, the dev extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("difftest", "difftest_pytest")
SOURCES = PACKAGES
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, check=False)


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")]


def test_the_layering_contract_holds():
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_planted_upward_import_breaks_the_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / "difftest" / "core" / "errors.py").open("a") as errors:
        errors.write("\nimport difftest.records.report  # planted: the bottom layer reaching for the top\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    assert "difftest.core.errors -> difftest.records.report" in done.stdout, done.stdout


def test_every_module_sits_in_a_layer():
    layers = _layers()
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    outside = sorted(m for m in graph.modules if m not in PACKAGES[1:] and m != "difftest"
                     and not any(m == layer or m.startswith(f"{layer}.") for layer in layers)
                     and m != "difftest.__main__")
    assert not outside, f"modules in no layer of pyproject.toml's contract: {outside}"


def test_no_import_cycle_counting_imports_inside_functions():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    modules = sorted(m for m in graph.modules if m not in PACKAGES)
    cycles = set()
    for module in modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported in PACKAGES:
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycles.add(tuple(sorted({module, *back})))
    assert not cycles, f"import cycles: {sorted(cycles)}"


def _deferred_project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every import of a project module inside a function of `path`."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            names = [inner.module or ""] if isinstance(inner, ast.ImportFrom) else \
                [a.name for a in inner.names] if isinstance(inner, ast.Import) else []
            if any(name.split(".")[0] in PACKAGES for name in names):
                found.append((inner.lineno, lines[inner.lineno - 1]))
    return found


def _explained(lines: list[str], index: int) -> bool:
    """Whether the import at lines[index], or one of the imports just above it, says '# deferred:'."""
    while index >= 0 and lines[index].strip().startswith(("import ", "from ")):
        if "# deferred:" in lines[index]:
            return True
        index -= 1
    return False


def test_a_project_import_inside_a_function_says_what_it_defers():
    unexplained = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = path.read_text().splitlines()
            for number, line in _deferred_project_imports(path):
                if not _explained(lines, number - 1):
                    unexplained.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not unexplained, "function-local project imports without a '# deferred: <what>' reason:\n" + \
        "\n".join(unexplained)


def _modules_loaded_by(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def test_the_errors_module_loads_no_other_project_module():
    loaded = _modules_loaded_by("import difftest.core.errors")
    project = {m for m in loaded if m.split(".")[0] in PACKAGES}
    assert project == {"difftest", "difftest.core", "difftest.core.errors"}, sorted(loaded)


def test_generators_do_not_import_hypothesis():
    loaded = _modules_loaded_by("import difftest.generators, difftest.core.spec, difftest.generators.cases")
    assert "hypothesis" not in loaded, "importing generators imported hypothesis"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_the_cli_help_imports_neither_torch_nor_the_runner(argv):
    loaded = _modules_loaded_by(f"import sys; sys.argv = ['difftest', *{argv!r}]\n"
                                "from difftest.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass")
    assert "torch" not in loaded and "difftest.engine.runner" not in loaded, \
        sorted(m for m in loaded if "difftest" in m)
