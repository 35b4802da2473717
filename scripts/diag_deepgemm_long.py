"""Diagnose DeepGEMM value failures seen at B=64, 128K (reports/h200/04-long-context): which rows,
which lengths, whether repeated launches agree bitwise, and whether the schedule matters.

Run on a GPU from the repo root: python3 scripts/diag_deepgemm_long.py [--launches 3]
"""

from __future__ import annotations

import argparse

import torch

from difftest.backends.deep_gemm import DeepGemmFlattened, DeepGemmNative
from difftest.compare import compare
from difftest.encode import encode
from difftest.runner import make_reference
from generators import build_case
from generators.cases import suite


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--name", default="random-mtp2-edges-bs64")
    parser.add_argument("--seed", type=int, default=4000)
    args = parser.parse_args()
    pairs = suite("random", 1, 0, (1, 2, 4), (64,), batch=64, max_model_len=131072, heads=64, head_dim=128)
    spec = next(s for s, seed in pairs if s.name == args.name and seed == args.seed)
    case = build_case(spec, args.seed, "cuda", name=f"{spec.name}-s{args.seed}")
    ref = make_reference(case)
    lens = case.seq_lens.tolist()
    print(case.describe(), "pool blocks", case.k_pool.shape[0])
    for backend in (DeepGemmNative(), DeepGemmFlattened()):
        inputs = encode(case, backend.contract)
        outs = []
        for launch in range(args.launches):
            got = backend(inputs, None)
            torch.cuda.synchronize()
            outs.append(got.clone())
            c = compare(ref.logits, got, ref.row_lens, backend.contract, ref.bound)
            seqs = sorted({r // case.next_n for r in c.value_rows + c.mask_rows + c.nan_rows})
            print(f"{backend.name} launch {launch}: {c.verdict.value} value rows {c.value_rows[:12]} "
                  f"seqs {seqs[:12]} their L {[lens[s] for s in seqs[:12]]} max rel {c.max_rel_err:.3g}")
        same = all(torch.equal(torch.nan_to_num(outs[0]), torch.nan_to_num(o)) for o in outs[1:])
        print(f"{backend.name}: launches bitwise identical: {same}")


if __name__ == "__main__":
    main()
