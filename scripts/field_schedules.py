"""DeepGEMM's sm90 paged MQA logits kernel on its own schedule and on FlagGems 5.0.2's, on a GPU.

    python3 scripts/field_schedules.py [--small]
    python3 scripts/field_schedules.py --classify OUTPUT.txt     (here, no GPU: reads a run's output)

Needs DeepGEMM importable and flag_gems/ops/get_paged_mqa_logits_metadata.py on sys.path (the
flag_gems-5.0.2 folder of .device-deps/field; `scripts/device_visit.sh field` sets both up). For each length
vector and next_n it prints whether the two schedules are equal, and whether the kernel's logits in every
row's window are bitwise equal under both: each 256-token split is computed by one CTA whichever SM
holds it, so a schedule that is a valid partition changes which SM does the work and nothing else. A
difference, an exception or (under compute-sanitizer) an out-of-bounds access is a finding to diagnose.
--small runs the few vectors that put FlagGems' idle-SM sentinel entries before work (for memcheck).
Exit status 1 when any vector's logits differ or its call raised.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter

import torch

from difftest.backends.deep_gemm import DeepGemm
from difftest.backends.flag_gems import DeepGemmFlagGemsSchedule
from difftest.core.kernel_inputs import encode
from difftest.generators import CaseSpec, build_case

# FlagGems' schedule differs from DeepGEMM's where SMs outnumber the units (idle SMs start at the sentinel
# (B, 0)), where every length is zero, and wherever the units do not divide evenly (remainder placement).
SMALL = [(300, 0, 5), (0, 0, 0), (1,), (0, 1), (257, 0, 0, 1), (33537, 0, 1)]


def vectors(small: bool, seed: int = 0) -> list[tuple[int, ...]]:
    """The length vectors: SMALL, then (unless small) drawn ones with empty and one-token requests mixed in."""
    if small:
        return SMALL
    draw = random.Random(seed)
    drawn = [tuple(draw.choice([0, 0, 1, 255, 256, 257, draw.randint(1, 70000)]) for _ in range(draw.randint(1, 64)))
             for _ in range(40)]
    return SMALL + drawn


def compare(lengths: tuple[int, ...], next_n: int) -> tuple[bool, bool]:
    """(the schedules are equal, the logits inside every window are bitwise equal) for one case."""
    native, flaggems = DeepGemm("deepgemm"), DeepGemmFlagGemsSchedule()
    spec = CaseSpec(batch=len(lengths), next_n=next_n, heads=64, head_dim=128, block_size=64,
                    max_model_len=max(max(lengths), 1), lengths=lengths)
    inputs = encode(build_case(spec, seed=len(lengths), device="cuda"), native.contract)
    ours, theirs = native.schedule(inputs), flaggems.schedule(inputs)
    limits = inputs.context_lens.reshape(-1, 1).long()
    window = torch.arange(inputs.max_model_len, device="cuda")[None, :] < limits
    a, b = native.launch(inputs, ours), native.launch(inputs, theirs)
    return torch.equal(ours, theirs), torch.equal(a[window], b[window])


def empty_before_work(lengths: tuple[int, ...]) -> bool:
    """Whether an empty request precedes a non-empty one: the shape of DeepGEMM 2.8.1's zero-length bug
    (docs/findings/deepgemm-zero-length-request.md), whose wrong rows depend on where the SMs' ranges end."""
    return any(n == 0 and any(later > 0 for later in lengths[i + 1:]) for i, n in enumerate(lengths))


def classify(output: str) -> Counter[tuple[bool, bool]]:
    """(logits differ, an empty request precedes work) -> pairs, for the lines of a full run's output (the
    vectors are regenerated from the same seed, in the same order)."""
    lines = [line for line in open(output) if line.startswith("next_n=")]
    pairs = [(lengths, next_n) for lengths in vectors(small=False) for next_n in (1, 2, 4)]
    if len(lines) != len(pairs):
        raise SystemExit(f"{output}: {len(lines)} result lines, a full run prints {len(pairs)}")
    return Counter(("DIFFER" in line, empty_before_work(lengths))
                   for line, (lengths, _) in zip(lines, pairs, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="only the vectors where the schedules differ most")
    parser.add_argument("--classify", metavar="OUTPUT", help="count a full run's differing pairs by whether an "
                        "empty request precedes work (no GPU needed)")
    args = parser.parse_args()
    if args.classify:
        for (differ, empty), count in sorted(classify(args.classify).items()):
            print(f"logits {'differ' if differ else 'equal '}, empty request before work {'yes' if empty else 'no '}: "
                  f"{count} pairs")
        return 0
    bad = 0
    for lengths in vectors(args.small):
        for next_n in (1, 2, 4):
            shown = list(lengths) if len(lengths) <= 6 else f"{list(lengths[:6])}... (B={len(lengths)})"
            try:
                same_schedule, same_logits = compare(lengths, next_n)
            except Exception as exc:  # a launch that fails is the finding: say which and go on
                print(f"next_n={next_n} L={shown}: raised {type(exc).__name__}: {exc}")
                bad += 1
                continue
            bad += not same_logits
            print(f"next_n={next_n} L={shown}: schedules {'equal' if same_schedule else 'differ'}, logits in the "
                  f"windows {'bitwise equal' if same_logits else 'DIFFER'}")
    print(f"{bad} case(s) with different logits or an exception")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
