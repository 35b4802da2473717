"""`difftest matrix merge` of n results: this tree against an earlier revision's merge, sizes side by side.

The cells are made from a real cell report (reports/matrix/cells/cpu-installed-quick/report.json, 21
results of the torch backend): its results repeated under fresh case names, over four backends and the
report's edge families, one in five a FAIL(mask) with 2 wrong rows, spread over --cells cells, as a long
fuzz cell makes them. Each tree merges them in a process of its own (`difftest matrix merge`, the tree
first on PYTHONPATH), timed inside the process around the command: the interpreter's start and the
imports, the same for both, are left out; both the wall time and the process's CPU time are kept (on a
machine other work shares, the CPU time is the steadier). The trees alternate at each size, --rounds
times; the table gives the medians, this tree's ratio to the baseline, and CPU seconds per 1,000
results (flat: linear in the results). The baseline is not run past --baseline-max results: issue 29
measured it quadratic (2k / 4k / 8k results: 8 / 23 / 78 s). A baseline before JUnit moved to the
standard library needs junitparser installed (pip install junitparser==5.0.3).

    python bench/matrix_merge.py --baseline e47dbb2 --out reports/cpu/matrix-merge
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: bench/ is on the path, the repository root is not
    sys.path.insert(0, str(ROOT))

from bench.make_run_ab import check_imports_from, export, head_name  # noqa: E402 - needs the root on sys.path

TEMPLATE = ROOT / "reports" / "matrix" / "cells" / "cpu-installed-quick" / "report.json"
BACKENDS = ("kernel-a", "kernel-b", "kernel-c", "kernel-d")
# Run in each tree's process: the merge's imports first, then the command alone on the clock.
TIMED = """
import contextlib, io, json, sys, time
from difftest.cli import main
import difftest.matrix.merge
import matplotlib.backends.backend_agg, matplotlib.figure  # the heatmap's imports: both trees draw one
start, cpu = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()):
    status = main(["matrix", "merge", "--out", sys.argv[1], *sys.argv[2:]])
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
                  "status": int(status)}))
"""


def make_cells(results: int, cells: int, folder: Path) -> list[Path]:
    """`cells` cell reports holding `results` results in all, made from TEMPLATE (see the docstring)."""
    template = json.loads(TEMPLATE.read_text())
    paths = []
    for c in range(cells):
        made = [_result(template["results"], i) for i in range(c, results, cells)]
        matrix = {"cell": f"cpu/v{c}/fuzz", "device": "cpu", "version": f"v{c}", "library": "installed",
                  "suite": "fuzz"}
        path = folder / f"cell{c}" / "report.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({**template, "run": {**template["run"], "matrix": matrix}, "results": made}))
        paths.append(path)
    return paths


def _result(results: list[dict], i: int) -> dict:
    result = copy.deepcopy(results[i % len(results)])
    result["case"], result["backend"] = f"random-s{i}", BACKENDS[i % len(BACKENDS)]
    if i % 5 == 0:
        result["verdict"] = result["comparison"]["verdict"] = "FAIL(mask)"
        result["comparison"]["mask_rows"] = [0, 1]
    return result


def time_merge(tree: Path, reports: list[Path], out: Path) -> dict:
    """One merge by `tree`'s difftest: its seconds and exit status."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", TIMED, str(out), *map(str, reports)], cwd=tree, env=environment,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the merge of {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(trees: dict[str, Path], sizes: list[int], args: argparse.Namespace, scratch: Path) -> list[dict]:
    """Rows of (size, tree, round, seconds), the trees alternating at each size."""
    rows = []
    for size in sizes:
        reports = make_cells(size, args.cells, scratch / f"cells-{size}")
        for round_ in range(1, args.rounds + 1):
            for label, tree in trees.items():
                if label == "baseline" and size > args.baseline_max:
                    continue
                timed = time_merge(tree, reports, scratch / f"out-{size}-{label}-{round_}")
                rows.append({"results": size, "tree": label, "round": round_, **timed})
                print(f"{size} results, {label}, round {round_}: {timed['seconds']:.2f} s, "
                      f"{timed['cpu_seconds']:.2f} s CPU", flush=True)
    return rows


def table(rows: list[dict], sizes: list[int], names: dict[str, str], command: str) -> str:
    """The markdown table: median wall and CPU seconds per tree and size, the ratios, CPU seconds per 1,000
    results."""
    def median(size: int, tree: str, key: str) -> float | None:
        seconds = [r[key] for r in rows if r["results"] == size and r["tree"] == tree]
        return statistics.median(seconds) if seconds else None

    lines = [f"`{command}`: baseline {names['baseline']}, this {names['this']}; {os.cpu_count()} CPUs; medians of "
             "the rounds, inside the merge's process.", "",
             "| results | baseline s (CPU s) | this s (CPU s) | this / baseline, wall (CPU) | CPU s per 1k results, "
             "baseline / this |", "|---|---|---|---|---|"]
    for size in sizes:
        wall = {tree: median(size, tree, "seconds") for tree in ("baseline", "this")}
        cpu = {tree: median(size, tree, "cpu_seconds") for tree in ("baseline", "this")}
        ran = wall["baseline"] is not None
        cells = [f"{wall['baseline']:.2f} ({cpu['baseline']:.2f})" if ran else "not run",
                 f"{wall['this']:.2f} ({cpu['this']:.2f})",
                 f"{wall['this'] / wall['baseline']:.3f}x ({cpu['this'] / cpu['baseline']:.3f}x)" if ran else "-",
                 (f"{1000 * cpu['baseline'] / size:.3f} / " if ran else "- / ") + f"{1000 * cpu['this'] / size:.3f}"]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the git revision to compare against")
    parser.add_argument("--sizes", default="2000,4000,8000,60000", help="results per merge, comma-separated")
    parser.add_argument("--baseline-max", type=int, default=8000, help="the largest merge the baseline runs")
    parser.add_argument("--cells", type=int, default=4, help="cells the results are spread over (default 4)")
    parser.add_argument("--rounds", type=int, default=1, help="baseline-then-this pairs per size (default 1)")
    parser.add_argument("--out", type=Path, help="folder for matrix_merge.json and matrix_merge.md")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as temporary:
        scratch = Path(temporary)
        trees = {"baseline": export(args.baseline, scratch), "this": ROOT}
        for tree in trees.values():
            check_imports_from(tree)
        if importlib.util.find_spec("junitparser") is None:
            print("note: junitparser is not installed; a baseline that writes JUnit with it will fail "
                  "(pip install junitparser==5.0.3)", file=sys.stderr)
        rows = measure(trees, sizes, args, scratch)
    names = {"baseline": args.baseline, "this": head_name()}
    command = shlex.join(["python", "bench/matrix_merge.py", *(sys.argv[1:] if argv is None else argv)])
    text = table(rows, sizes, names, command)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "matrix_merge.md").write_text(text)
        (args.out / "matrix_merge.json").write_text(json.dumps({"trees": names, "runs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
