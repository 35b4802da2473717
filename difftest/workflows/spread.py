"""`difftest run --gpus N`: one run's cases spread over N child processes, one GPU each.

The parent plans the run as usual, then starts `python -m difftest.cli run ... --shard I/N` for
I = 0 .. N-1, child I seeing only its own GPU (CUDA_VISIBLE_DEVICES: visible_devices_for_shard).
Shard I runs the planned (spec, seed) pairs whose index in the plan is I mod N (difftest.engine.plan.Shard) and
streams its results as JSONL into a part folder. The parent waits for every child and merges their
results in plan order (merge): the report reads as one process's run, and each result names the
GPU it was computed on (CaseResult.gpu). A child that dies costs only the results it had not
streamed yet: the parent says which shard died and how (ShardRun.describe) and keeps the rest.
Ctrl-C stops every child and hands on what they streamed (ShardsInterrupted). Each child dies with
the parent, should the parent be killed (join_parent), and the part folder lives in the parent's run
folder (difftest.core.lifetime), which the next run sweeps away.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from difftest.core.errors import require
from difftest.core.kinds import ExitStatus
from difftest.core.lifetime import die_with_parent, scratch
from difftest.engine.isolate import crash_summary, exit_description
from difftest.engine.result import CaseResult
from difftest.records.serialize import load_results

VISIBLE = "CUDA_VISIBLE_DEVICES"
PARENT = "DIFFTEST_SPREAD_PARENT"  # in a child's environment: the pid of the run it is a shard of
PARENT_ONLY = ("--gpus", "--report", "--stream", "--junit")  # `run` options only the parent acts on; each takes a value


def visible_devices_for_shard(shard: int, gpus: int, parent_visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES of shard `shard` of a run over `gpus` GPUs: entry `shard` of the parent's
    CUDA_VISIBLE_DEVICES (indices and UUIDs alike) when it is set, else `shard` itself. SpecError
    naming `gpus` when the parent's list has fewer than `gpus` entries."""
    if parent_visible is None:
        return str(shard)
    listed = [entry.strip() for entry in parent_visible.split(",") if entry.strip()]
    require(gpus <= len(listed), "gpus", gpus, f"at most the {len(listed)} GPUs of {VISIBLE}={parent_visible!r}")
    return listed[shard]


def gpu_environments(gpus: int, device: str, device_count: int, parent_visible: str | None) -> list[dict[str, str]]:
    """What spreading over `gpus` GPUs adds to each child's environment: its own CUDA_VISIBLE_DEVICES;
    SpecError naming `gpus`."""
    require(gpus >= 1, "gpus", gpus, "an integer >= 1")
    require(device == "cuda", "gpus", gpus, "device 'cuda' as well (a CPU run is not spread over GPUs)")
    require(gpus <= device_count, "gpus", gpus, f"at most the {device_count} GPUs torch sees")
    return [{VISIBLE: visible_devices_for_shard(i, gpus, parent_visible)} for i in range(gpus)]


def child_argv(argv: Sequence[str], index: int, count: int, stream: Path) -> list[str]:
    """The `run` command line `argv` as shard index/count runs it: without the parent's own options
    (PARENT_ONLY, as `--option value` or `--option=value`), streaming into `stream`, no progress bar."""
    kept: list[str] = []
    words = iter(argv)
    for word in words:
        name, equals, _ = word.partition("=")
        if name not in PARENT_ONLY:
            kept.append(word)
        elif not equals:
            next(words, None)  # its value
    return [*kept, "--shard", f"{index}/{count}", "--stream", str(stream), "--no-progress"]


@dataclasses.dataclass(frozen=True)
class ShardRun:
    """One child of a spread run: its shard, what its environment added, how it ended, what it streamed."""

    index: int
    count: int
    env: dict[str, str]  # added to the parent's environment: its CUDA_VISIBLE_DEVICES
    returncode: int  # subprocess's: negative for the signal that killed it
    results: list[CaseResult]  # in its shard's plan order
    expected: int  # the results its shard gives when it runs to the end
    log: str  # what its stderr says about its death (isolate.crash_summary); '' when it did not die

    @property
    def died(self) -> bool:
        """True unless it ended as a run ends: 0 (every result passed or skipped) or 1 (some failed)."""
        return self.returncode not in (ExitStatus.OK, ExitStatus.FAILED)

    def describe(self) -> str:
        """'shard 0/2 (CUDA_VISIBLE_DEVICES=0): exited with status 0, 14 of 14 results', or for a dead one
        'shard 1/2 (CUDA_VISIBLE_DEVICES=1) died: killed by SIGSEGV, 1 of 14 results: Fatal Python error: ...'."""
        env = " ".join(f"{name}={value}" for name, value in self.env.items())
        head = f"shard {self.index}/{self.count}" + (f" ({env})" if env else "") + (" died" if self.died else "")
        tail = f": {self.log}" if self.log else ""
        return f"{head}: {exit_description(self.returncode)}, {len(self.results)} of {self.expected} results{tail}"

    def info(self) -> dict[str, object]:
        """Its entry under `shards` in the report's run info."""
        return {"shard": f"{self.index}/{self.count}", "env": self.env, "exit": exit_description(self.returncode),
                "died": self.died, "results": len(self.results), "expected": self.expected, "log": self.log}


class ShardsInterrupted(KeyboardInterrupt):
    """Ctrl-C while the children ran: `shards` holds what each had streamed by then."""

    def __init__(self, shards: list[ShardRun]) -> None:
        super().__init__()
        self.shards = shards


def join_parent() -> None:
    """In a child of a spread run (PARENT in its environment): die with the run, however it dies
    (lifetime.die_with_parent). The variable is dropped, so this process's own children do not see it."""
    parent = os.environ.pop(PARENT, None)
    if parent is not None and parent.isdigit():
        die_with_parent(int(parent))


def run_shards(argv: Sequence[str], envs: Sequence[dict[str, str]], expected: Sequence[int]) -> list[ShardRun]:
    """Shard i of the `run` command line `argv` in a child process whose environment adds envs[i],
    all children at once; waits for every one and returns what each streamed, a dead one's too.
    `expected[i]` is the number of results shard i gives when it runs to the end. Ctrl-C stops every
    child and raises ShardsInterrupted with what they had streamed."""
    count = len(envs)
    with scratch("difftest-shards-") as folder:
        children = [_start(argv, i, count, env, folder) for i, env in enumerate(envs)]
        try:
            codes = [child.wait() for child in children]
        except KeyboardInterrupt:
            _stop(children)
            raise ShardsInterrupted([_collected(ShardRun(i, count, envs[i], child.returncode, [], expected[i], ""),
                                                folder) for i, child in enumerate(children)]) from None
        finally:
            _stop(children)  # an error here leaves no child running either
        return [_collected(ShardRun(i, count, envs[i], code, [], expected[i], ""), folder)
                for i, code in enumerate(codes)]


def _stop(children: Sequence[subprocess.Popen]) -> None:
    """SIGKILL every child still running and reap it: each result it finished is already streamed."""
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()


def _start(argv: Sequence[str], index: int, count: int, env: dict[str, str], folder: Path) -> subprocess.Popen:
    """Child `index`: `python -m difftest.cli` on its shard, told this process's pid so that it dies
    with it (join_parent); its stderr (with faulthandler's stack should it crash) goes to its log in
    `folder`, its table nowhere (the parent prints the merged one)."""
    command = [sys.executable, "-X", "faulthandler", "-m", "difftest.cli",
               *child_argv(argv, index, count, folder / f"shard-{index}.jsonl")]
    with (folder / f"shard-{index}.log").open("wb") as log:
        return subprocess.Popen(command, env={**os.environ, **env, PARENT: str(os.getpid())},
                                stdout=subprocess.DEVNULL, stderr=log)


def _collected(shard: ShardRun, folder: Path) -> ShardRun:
    """`shard` with the results its stream holds (a torn last line ignored) and, if it died, its log's summary."""
    stream = folder / f"shard-{shard.index}.jsonl"
    results = load_results(stream, "gpus") if stream.exists() else []
    log = crash_summary(folder / f"shard-{shard.index}.log") if shard.died else ""
    return dataclasses.replace(shard, results=results, log=log)


def merge(case_names: Sequence[str], shards: Sequence[ShardRun]) -> list[CaseResult]:
    """The shards' results in plan order: case by case as `case_names` lists them, each case's
    results in its backends' order (the order its shard made them)."""
    by_case: dict[str, list[CaseResult]] = {}
    for shard in shards:
        for result in shard.results:
            by_case.setdefault(result.case, []).append(result)
    return [result for name in dict.fromkeys(case_names) for result in by_case.get(name, [])]
