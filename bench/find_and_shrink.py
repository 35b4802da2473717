"""How long it takes to get from a planted bug to its minimal reproducer, on the CPU.

Rows: (a) hypothesis finding the planted block-boundary bug with difftest.generators.strategies.cases and
shrinking it; (b) difftest.workflows.shrink on a bundle of a DeepSeek-shaped failing batch, reduced on its spec;
(c) the same case without its spec (as a golden file would be), reduced by slicing its tensors.
Each row prints the case size before (the first failing example / the bundle's case) and after.
The target is under 30 s a row.

Method: one wall-clock measurement (time.perf_counter) per row, after one untimed warm-up probe,
since a search is a single long call whose time is what a user waits; torch runs one intra-op
thread, as these small tensors only pay a second thread's synchronisation.

Run from the repository root:  python bench/find_and_shrink.py
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

# The script must run from a checkout that is not pip-installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import given, settings

from difftest.backends import as_backend
from difftest.core.case import Case
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_one
from difftest.generators import CaseSpec, Stale, Values, build_case
from difftest.generators.strategies import cases
from difftest.records.bundle import load_bundle, write_bundle
from difftest.workflows.shrink import shrink
from tests import planted

BACKEND = as_backend(planted.block_boundary_off_by_one, "bench", "tests.planted:block_boundary_off_by_one")
# A DeepSeek-indexer-shaped batch (H 64, D 128, block 64) with MTP, padding, shared and stale table entries.
LARGE = CaseSpec(name="large", lengths=(370, 1000, 5, 640, 900, 2048, 33, 1536), next_n=3, padding=2,
                 shared_blocks=True, extra_columns=1, values=Values.HEAVY, stale=Stale.OTHER, heads=64,
                 head_dim=128, block_size=64, max_model_len=2048)


@dataclasses.dataclass(frozen=True)
class Row:
    method: str
    seconds: float
    runs: int  # backend runs (hypothesis examples, or shrink probes)
    before: Case
    after: Case


def size(case: Case) -> str:
    """B (padding included), the lengths, the rows and H x D."""
    return f"B={case.batch} L={case.seq_lens.tolist()} rows={case.rows} H={case.heads} D={case.head_dim}"


def hypothesis_row() -> Row:
    failing: list[Case] = []
    runs = 0

    @settings(max_examples=100, deadline=None, derandomize=True, database=None, print_blob=False)
    @given(cases(block_sizes=(16,), heads=(1, 4, 32), head_dims=(16, 64)))
    def agrees(case: Case) -> None:
        nonlocal runs
        runs += 1
        if run_one(BACKEND, case, RunConfig()).verdict.failed:
            failing.append(case)
            raise AssertionError("planted bug found")

    start = time.perf_counter()
    try:
        agrees()
    except AssertionError:
        pass
    seconds = time.perf_counter() - start
    if not failing:
        raise SystemExit("hypothesis did not find the planted bug: the benchmark has nothing to time")
    return Row("hypothesis find + shrink", seconds, runs, failing[0], failing[-1])


def shrink_row(method: str, case: Case, folder: Path) -> Row:
    bundle = load_bundle(write_bundle(folder, case, run_one(BACKEND, case, RunConfig()), RunConfig()))
    found = shrink(bundle, BACKEND, budget_seconds=30.0)
    return Row(method, found.seconds, found.probes, case, found.case)


def main() -> None:
    torch.set_num_threads(1)
    large = build_case(LARGE, seed=7)
    run_one(BACKEND, large, RunConfig())  # warm-up: lazy imports and first-touch allocations
    with tempfile.TemporaryDirectory() as tmp:
        rows = [hypothesis_row(),
                shrink_row("difftest shrink (spec)", large, Path(tmp) / "spec"),
                shrink_row("difftest shrink (tensors)", dataclasses.replace(large, meta={}), Path(tmp) / "tensors")]
    print(f"{'method':<27} {'seconds':>7} {'runs':>5}  before -> after")
    for r in rows:
        print(f"{r.method:<27} {r.seconds:>7.2f} {r.runs:>5}  {size(r.before)}\n{'':<42}-> {size(r.after)}")


if __name__ == "__main__":
    main()
