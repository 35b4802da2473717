"""`make run`'s wall time, this tree against an earlier revision's, in alternation.

Each tree runs its own `make run` command: the `difftest run` arguments of its Makefile's `run` recipe
(the suite and the flags `make run` used then), with the report sent to a fresh file, in this
interpreter's environment and with the tree's own packages first on the path. The runs alternate,
baseline then this tree, --rounds times; the first pair also warms the machine (the page cache, Triton's
compilation cache), so with two rounds or more the means leave out round 1. The suites can differ
between revisions, so the table gives each run's case count beside its time, and the ratio is given
both for the wall time and per case.

    python bench/make_run_ab.py --baseline d1d1983 --out reports/cpu/make-run-ab
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE_MARK = "$(BIN)/difftest run"


@dataclasses.dataclass(frozen=True)
class BackendRow:
    """One line of `difftest run`'s summary table."""

    backend: str
    cases: int
    rows: int
    mask_mismatch: str


@dataclasses.dataclass(frozen=True)
class Timing:
    tree: str
    round: int
    seconds: float
    exit_status: int
    table: list[BackendRow]

    @property
    def cases(self) -> int:
        return max((row.cases for row in self.table), default=0)


def make_run_arguments(makefile: str, report: Path) -> list[str]:
    """The `difftest run` arguments of a Makefile's `run` recipe, with `--report` sent to `report`."""
    line = next((text for text in makefile.splitlines() if RECIPE_MARK in text), None)
    if line is None:
        raise ValueError(f"no '{RECIPE_MARK}' line in the Makefile")
    words = shlex.split(line.split(RECIPE_MARK, 1)[1].split("||", 1)[0])
    arguments, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == "--report":
            skip = True
        elif word != "--overwrite":  # the report is a fresh file
            arguments.append(word)
    return [*arguments, "--report", str(report)]


def summary_table(output: str) -> list[BackendRow]:
    """The backends' rows of the summary table `difftest run` prints first (a SKIP row has no cases)."""
    lines = output.splitlines()
    start = next((i for i, text in enumerate(lines) if text.startswith("backend ")), None)
    if start is None:
        return []
    table = []
    for text in lines[start + 1:]:
        words = text.split()
        if not words:
            break
        if len(words) >= 4 and words[1].isdigit() and words[2].isdigit():
            table.append(BackendRow(words[0], int(words[1]), int(words[2]), words[3]))
    return table


def export(revision: str, into: Path) -> Path:
    """The tree of `revision` (git archive) under `into`."""
    archive, tree = into / "tree.tar", into / "tree"
    subprocess.run(["git", "archive", "--output", str(archive), revision], cwd=ROOT, check=True)
    tree.mkdir()
    subprocess.run(["tar", "-x", "-f", str(archive), "-C", str(tree)], check=True)
    return tree


def time_make_run(tree: Path, label: str, round_: int, scratch: Path) -> Timing:
    """One run of the tree's `make run` command, timed from the process's start to its end."""
    report = scratch / f"{label}-{round_}.json"
    arguments = make_run_arguments((tree / "Makefile").read_text(), report)
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "difftest.cli", "run", *arguments], cwd=tree,
                          env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (scratch / f"{label}-{round_}.log").write_text(done.stdout + done.stderr)
    return Timing(label, round_, seconds, done.returncode, summary_table(done.stdout))


def check_imports_from(tree: Path) -> None:
    """Fail unless a process started as the runs are imports difftest from `tree`."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    found = subprocess.run([sys.executable, "-c", "import difftest; print(difftest.__file__)"], cwd=tree,
                           env=environment, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"difftest imported from {found}, not from {tree}")


def counted(timings: list[Timing]) -> list[Timing]:
    """The runs the means count: all but round 1 when there are later rounds (round 1 warms)."""
    later = [t for t in timings if t.round > 1]
    return later or timings


def summarize(timings: list[Timing], baseline: str, this: str) -> dict:
    """Means per tree, and this tree's ratios to the baseline's."""
    means = {}
    for label in ("baseline", "this"):
        runs = counted([t for t in timings if t.tree == label])
        means[label] = {"seconds": statistics.mean(t.seconds for t in runs),
                        "seconds_per_case": statistics.mean(t.seconds / max(t.cases, 1) for t in runs),
                        "cases": runs[-1].cases}
    return {"baseline": baseline, "this": this, "means": means,
            "ratio_seconds": means["this"]["seconds"] / means["baseline"]["seconds"],
            "ratio_seconds_per_case": means["this"]["seconds_per_case"] / means["baseline"]["seconds_per_case"]}


def markdown(timings: list[Timing], summary: dict, command: str) -> str:
    lines = [f"`{command}`: `make run`'s command, {summary['baseline']} (baseline) against {summary['this']} "
             f"(this), alternating; {os.cpu_count()} CPUs.", "",
             "| round | tree | seconds | exit | cases | s / case | table (backend: -inf-mask mismatch) |",
             "|---|---|---|---|---|---|---|"]
    for t in timings:
        table = ", ".join(f"{row.backend}: {row.mask_mismatch}" for row in t.table if row.cases)
        lines.append(f"| {t.round} | {t.tree} | {t.seconds:.1f} | {t.exit_status} | {t.cases} | "
                     f"{t.seconds / max(t.cases, 1):.2f} | {table} |")
    means = summary["means"]
    lines += ["", f"Means ({'rounds 2 on' if any(t.round > 1 for t in timings) else 'round 1'}): baseline "
              f"{means['baseline']['seconds']:.1f} s ({means['baseline']['seconds_per_case']:.2f} s a case), this "
              f"{means['this']['seconds']:.1f} s ({means['this']['seconds_per_case']:.2f} s a case). This / baseline: "
              f"{summary['ratio_seconds']:.2f}x the wall time, {summary['ratio_seconds_per_case']:.2f}x per case."]
    return "\n".join(lines) + "\n"


def head_name() -> str:
    """This tree's name: its HEAD, and whether tracked files differ from it (the runs use the working tree)."""
    def git(*arguments: str) -> str:
        return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    changed = git("status", "--porcelain", "--untracked-files=no").strip()
    return git("rev-parse", "--short", "HEAD").strip() + (" with uncommitted changes" if changed else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=2, help="baseline-then-this pairs (default 2)")
    parser.add_argument("--out", type=Path, help="folder for make_run_ab.json and make_run_ab.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        scratch = Path(temporary)  # the runs' reports and logs
        trees = {"baseline": export(args.baseline, Path(temporary)), "this": ROOT}
        for tree in trees.values():
            check_imports_from(tree)
        timings = []
        for round_ in range(1, args.rounds + 1):
            for label, tree in trees.items():
                timings.append(time_make_run(tree, label, round_, scratch))
                print(f"round {round_} {label}: {timings[-1].seconds:.1f} s, exit {timings[-1].exit_status}",
                      flush=True)
        summary = summarize(timings, args.baseline, head_name())
        command = shlex.join(["python", "bench/make_run_ab.py", *(sys.argv[1:] if argv is None else argv)])
        text = markdown(timings, summary, command)
        print(text)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "make_run_ab.md").write_text(text)
            rows = [{**dataclasses.asdict(t), "cases": t.cases} for t in timings]
            (args.out / "make_run_ab.json").write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    return 0 if all(t.exit_status in (0, 1) for t in timings) else 1


if __name__ == "__main__":
    sys.exit(main())
