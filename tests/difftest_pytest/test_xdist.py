"""pytest-xdist: one seed on every worker, a summary and a report that cover them all, one GPU per worker."""

from __future__ import annotations

import json
import re

import pytest

from difftest.records.serialize import load_results
from difftest_pytest.workers import gpu_for_worker


@pytest.mark.parametrize(("worker_id", "device_count", "gpu"), [
    ("gw0", 2, 0), ("gw1", 2, 1), ("gw2", 2, 0), ("gw5", 4, 1), ("gw3", 1, 0),
    ("gw0", 0, None), ("master", 2, None), ("gw", 2, None),
])
def test_gpu_for_worker(worker_id: str, device_count: int, gpu: int | None) -> None:
    assert gpu_for_worker(worker_id, device_count) == gpu


def test_two_workers_share_the_seed_and_the_summary_covers_both(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_seeds="""
        import pathlib

        import pytest

        @pytest.mark.parametrize("i", range(2))
        def test_seed(i, difftest_seed, worker_id):
            (pathlib.Path(__file__).parent / f"seed-{worker_id}-{i}.txt").write_text(str(difftest_seed))
    """)
    # --dist each: every worker runs every test, so the summary must count each suite case twice.
    # No --difftest-seed: a worker that drew its own seed would name other cases and write another seed.
    result = pytester.runpytest_inprocess("-n", "2", "--dist", "each", "-p", "no:cacheprovider", "--difftest-suite",
                                          "--difftest-backends=torch", "--difftest-report=r.json",
                                          "-k", "seed or length-one or block-boundaries")
    result.assert_outcomes(passed=8)
    header = re.search(r"^difftest: --difftest-seed=(\d+) ", result.stdout.str(), re.MULTILINE)
    assert header is not None, result.stdout.str()
    seeds = {path.name: path.read_text() for path in pytester.path.glob("seed-*.txt")}
    assert sorted(seeds) == ["seed-gw0-0.txt", "seed-gw0-1.txt", "seed-gw1-0.txt", "seed-gw1-1.txt"]
    assert set(seeds.values()) == {header.group(1)}
    result.stdout.fnmatch_lines(["*= difftest =*", "torch *4 *28 *0/28 *PASS",
                                 "torch: 0/28 rows with the wrong -inf mask"])
    # Every result names the GPU it was computed on: none here, and no per-device line.
    results = json.loads((pytester.path / "r.json").read_text())["results"]
    assert len(results) == 4 and all("gpu" in r and r["gpu"] is None for r in results), f"{results=}"
    assert [r.gpu for r in load_results(pytester.path / "r.json")] == [None] * 4
    result.stdout.no_fnmatch_line("results per device:*")
