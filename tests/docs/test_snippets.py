"""The user documentation runs: every snippet of docs/*.md, as a user would run it.

Each page gets a fresh project folder, and its fenced blocks are taken in order:

* ```python: a block whose first line names a file (`# mymodule.py`) is written to that file (the
  commands that use it run it); any other block is written to snippet_<line>.py and run with this
  interpreter, the folder as working directory. ```python no-run is only compiled: it is for
  fragments that cannot run on a CPU (a CUDA-only kernel).
* a block of another language whose first line names a file (```toml `# known.toml`) is written.
* ```sh: each command line (`difftest ...`, `python -m difftest ...`, `pytest ...`,
  `python -m pytest ...`) runs under bash in the folder, this environment's bin first on PATH. A
  trailing `# exit N` is the status it must end with (default 0). Other lines (pip install, make)
  are not run. ```sh no-run is not run.
* `<!-- snippets: uses PAGE.md -->` first writes the files PAGE's blocks name.

Pages run side by side (each page's steps in order), so the file stays near a minute on two cores.
A failing step fails its page's test with the page, the line and the output. The last tests check
that docs/cli.md names every option of the command, and that the pages' relative links resolve.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
BIN = Path(sys.executable).parent
STEP_TIMEOUT = 180  # seconds for one command or snippet
WORKERS = max(1, min(4, os.cpu_count() or 1))

FENCE = re.compile(r"^```(\S*)(.*)$")
NAMED = re.compile(r"^#\s*([\w./-]+\.(?:py|toml|json|txt|cfg|ini))\s*$")
COMMAND = re.compile(r"^(?:difftest|pytest|python -m (?:difftest|pytest))(?:\s|$)")
EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")
USES = re.compile(r"<!--\s*snippets:\s*uses\s+(\S+\.md)\s*-->")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its language, its flags (`no-run`), the line of its first body line, its body."""

    lang: str
    flags: tuple[str, ...]
    line: int
    body: str

    @property
    def runs(self) -> bool:
        return "no-run" not in self.flags

    @property
    def file_name(self) -> str | None:
        first = self.body.splitlines()[0] if self.body else ""
        found = NAMED.match(first)
        return found.group(1) if found else None


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing to do in the page's folder: write a file, or run a command and expect a status."""

    page: Path
    line: int
    kind: str  # "write", "python", "shell"
    text: str
    file_name: str = ""
    expect: int = 0

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks (fences at the start of a line)."""
    found, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        start = index + 1
        index = start
        while index < len(lines) and lines[index].strip() != "```":
            index += 1
        found.append(Block(opening.group(1), tuple(opening.group(2).split()), start + 1,
                           "\n".join(lines[start:index]) + "\n"))
        index += 1
    return found


def _commands(block: Block) -> list[tuple[int, str]]:
    """(line, command) of a sh block's runnable lines; a trailing backslash continues a line."""
    out, pending, first = [], "", 0
    for offset, raw in enumerate(block.body.splitlines()):
        if not pending:
            first = block.line + offset
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if COMMAND.match(pending.strip()):
            out.append((first, pending.strip()))
        pending = ""
    return out


def written(page: Path) -> list[Step]:
    """The files a page's blocks name, as write steps."""
    return [Step(page, b.line, "write", b.body, b.file_name) for b in blocks(page) if b.runs and b.file_name]


def steps(page: Path) -> list[Step]:
    """What running `page` does, in order."""
    out: list[Step] = []
    for used in USES.findall(page.read_text()):
        out += written(DOCS / used)
    for block in blocks(page):
        if block.lang == "python" and not block.runs:
            out.append(Step(page, block.line, "compile", block.body))
        elif not block.runs:
            continue
        elif block.file_name:
            out.append(Step(page, block.line, "write", block.body, block.file_name))
        elif block.lang == "python":
            out.append(Step(page, block.line, "python", block.body, f"snippet_{block.line}.py"))
        elif block.lang == "sh":
            for line, command in _commands(block):
                status = EXIT.search(command)
                out.append(Step(page, line, "shell", command, expect=int(status.group(1)) if status else 0))
    return out


def _environment() -> dict[str, str]:
    """This environment's bin first on PATH; nothing of the pytest run that runs these tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")  # the pages run side by side: one torch thread each
    return env


def _run(step: Step, folder: Path) -> str | None:
    """Do `step` in `folder`; None when it went as expected, else what went wrong."""
    if step.kind == "compile":
        try:
            compile(step.text, step.where(), "exec")
        except SyntaxError as exc:
            return f"{step.where()}: does not compile: {exc}"
        return None
    if step.kind == "write":
        target = folder / step.file_name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(step.text)
        if target.suffix == ".py":
            try:
                compile(step.text, step.where(), "exec")
            except SyntaxError as exc:
                return f"{step.where()}: {step.file_name} does not compile: {exc}"
        return None
    if step.kind == "python":
        (folder / step.file_name).write_text(step.text)
        argv: list[str] | str = [sys.executable, step.file_name]
    else:
        argv = ["bash", "-c", step.text]
    try:
        done = subprocess.run(argv, cwd=folder, env=_environment(), capture_output=True, text=True,
                              timeout=STEP_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return f"{step.where()}: still running after {STEP_TIMEOUT} s: {step.text.strip()[:200]}"
    if done.returncode == step.expect:
        return None
    shown = step.text.strip() if step.kind == "shell" else f"python {step.file_name}"
    output = (done.stdout + done.stderr)[-4000:]
    return f"{step.where()}: {shown}\nexited {done.returncode}, expected {step.expect}\n{output}"


def run_page(page: Path, folder: Path) -> list[str]:
    """Every step of `page` in `folder`, in order, stopping at the first that goes wrong."""
    for step in steps(page):
        failure = _run(step, folder)
        if failure:
            return [failure]
    return []


@pytest.fixture(scope="module")
def page_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """page -> its future: every page this session selected, started at once, WORKERS at a time. On
    a pytest-xdist worker (which runs only some of the items it collected) a page starts when its
    test asks for it."""
    if not (BIN / "difftest").exists():
        pytest.fail(f"difftest is not installed beside {sys.executable} (pip install -e .)")
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:

        def start(name: str) -> concurrent.futures.Future[list[str]]:
            return pool.submit(run_page, DOCS / name, tmp_path_factory.mktemp(Path(name).stem))

        runs: dict[str, concurrent.futures.Future[list[str]]] = {}
        if not hasattr(request.config, "workerinput"):
            selected = [item.callspec.params["page"] for item in request.session.items
                        if getattr(item, "originalname", None) == "test_page" and hasattr(item, "callspec")]
            # The pages with the most commands start first, so the last to finish is a short one.
            for name in sorted(dict.fromkeys(selected), key=lambda name: -len(_commands_of(name))):
                runs[name] = start(name)
        yield lambda name: (runs[name] if name in runs else runs.setdefault(name, start(name))).result()


def _commands_of(name: str) -> list[Step]:
    return [s for s in steps(DOCS / name) if s.kind in ("shell", "python")]


@pytest.mark.parametrize("page", [p.name for p in PAGES if steps(p)])
def test_page(page: str, page_runs) -> None:
    failures = page_runs(page)
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- the harness itself

def test_blocks_and_commands_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n```python\n# mod.py\nx = 1\n```\n```sh\npip install .\n"
                    "difftest run --backends mod:x \\\n  --seed 1   # exit 1\nmake test\n```\n"
                    "```python no-run\nimport cuda_only\n```\n```text\ndifftest run\n```\n")
    found = steps(page)
    assert [(s.kind, s.line) for s in found] == [("write", 3), ("shell", 8), ("compile", 13)]
    assert found[0].file_name == "mod.py"
    assert found[1].text == "difftest run --backends mod:x    --seed 1   # exit 1" and found[1].expect == 1


def test_a_failing_step_names_its_page_and_line(tmp_path: Path) -> None:
    page = DOCS / "example.md"  # never written: the step only names it
    failure = _run(Step(page, 7, "shell", "difftest run --cases nonsense"), tmp_path)
    assert failure is not None and failure.startswith("docs/example.md:7: difftest run --cases nonsense")
    assert "exited 2, expected 0" in failure


# --------------------------------------------------------------------------- what the pages say

def test_cli_page_names_every_option() -> None:
    from difftest.cli import build_parser

    text = (DOCS / "cli.md").read_text()
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    missing = [f"difftest {name} {option}" for name, sub in commands.choices.items()
               for action in sub._actions for option in action.option_strings
               if option.startswith("--") and option != "--help" and f"`{option}" not in text
               and f"{option} " not in text]
    assert not missing, f"docs/cli.md does not mention {missing}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


@pytest.mark.parametrize("page", ["README.md", *(str(p.relative_to(ROOT)) for p in PAGES)])
def test_relative_links_resolve(page: str) -> None:
    path = ROOT / page
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page}: links that do not resolve: {broken}"
