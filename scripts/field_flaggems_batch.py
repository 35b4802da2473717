"""FlagGems 5.0.2's paged-logits metadata (flag_gems/ops/get_paged_mqa_logits_metadata.py) against the batch
size: its one Triton program holds the whole batch (BLOCK_SIZE = next_power_of_2(batch) lanes of a tl.cumsum),
so each power of two is a new compilation of a larger program. Times the first call (compilation and run)
and a second one at each batch size, each size in a process of its own under a time limit. On the GPU, from
the project root, FlagGems' file on PYTHONPATH (.device-deps/field/flag_gems-5.0.2):

    python3 scripts/field_flaggems_batch.py [--limit SECONDS] [BATCH ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

DEFAULT_BATCHES = (8192, 32768, 58112, 65537)
H200_SMS = 132


def measure(batch: int) -> None:
    """One batch size, in this process: the schedule of `batch` requests of 4096 tokens, timed twice."""
    import torch

    from difftest.backends import flag_gems

    module = flag_gems.load(flag_gems.find(), interpret=False)
    lens = torch.full((batch,), 4096, dtype=torch.int32, device="cuda")
    for call in ("first", "second"):
        torch.cuda.synchronize()
        start = time.perf_counter()
        module.get_paged_mqa_logits_metadata(lens, 64, H200_SMS)
        torch.cuda.synchronize()
        print(f"batch {batch}: {call} call {time.perf_counter() - start:.3f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batches", nargs="*", type=int, default=list(DEFAULT_BATCHES))
    parser.add_argument("--limit", type=float, default=120.0, help="seconds per batch size (default 120)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child's batch size
    args = parser.parse_args()
    if args.one is not None:
        measure(args.one)
        return 0
    for batch in args.batches:
        try:
            done = subprocess.run([sys.executable, __file__, "--one", str(batch)], timeout=args.limit,
                                  capture_output=True, text=True)
            print(done.stdout.strip() or f"batch {batch}: exit {done.returncode}: {done.stderr.strip()[-300:]}",
                  flush=True)
        except subprocess.TimeoutExpired as exc:
            said = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            print(f"{said.strip()}\nbatch {batch}: no answer within {args.limit:.0f} s (killed)".strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
