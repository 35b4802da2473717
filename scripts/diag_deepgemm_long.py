"""Diagnose DeepGEMM value failures seen at B=64, 128K (reports/h200/deepgemm-zero-length/04-long-context): which rows,
which lengths, whether repeated launches agree bitwise, whose inputs a wrong row was computed from,
and whether the number of schedule slots changes which rows fail.

Run on a GPU from the repo root: python3 scripts/diag_deepgemm_long.py [--launches 3]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from difftest.backends.deep_gemm import DeepGemmFlattened, DeepGemmNative
from difftest.core.case import Case
from difftest.core.kernel_inputs import encode
from difftest.engine.comparison import compare
from difftest.generators import build_case
from difftest.generators.cases import suite
from difftest.oracles.paged_mqa_logits import paged_mqa_logits
from difftest.oracles.reference import make_reference

PROBE_POSITIONS = 2048  # positions of a wrong row compared against each candidate explanation


def attribute(case: Case, got: torch.Tensor, row: int) -> str:
    """Which query row's q and weights, and which sequence's keys, reproduce wrong row `row` best.

    Candidates: every query row of the batch against the row's own keys, then the row's own q
    against every sequence's keys; each scored by its largest error over the first positions,
    relative to the row's largest logit.
    """
    seq, next_n = row // case.next_n, case.next_n
    limit = int(case.row_lens().reshape(-1)[row])
    n = min(limit, PROBE_POSITIONS)
    if n == 0:
        return "empty window"
    q, k = case.q_values(), case.k_values()
    rows = case.batch * next_n
    lens = torch.full((rows, 1), n, device=case.device)
    # Every row's q against sequence `seq`'s keys: one batch of `rows` single-row requests.
    by_q = paged_mqa_logits(q.reshape(rows, 1, case.heads, -1), k, case.scale_pool, case.weights,
                            case.block_table[seq].expand(rows, -1), lens, n)
    # Row `row`'s q against every sequence's keys (positions past a sequence's end are not masked).
    by_k = paged_mqa_logits(q.reshape(rows, 1, case.heads, -1)[row].expand(case.batch, 1, -1, -1), k,
                            case.scale_pool, case.weights[row].expand(case.batch, -1), case.block_table,
                            torch.full((case.batch, 1), n, device=case.device), n)
    target = got[row, :n].double()
    scale = target.abs().max().clamp_min(1e-30)
    q_err = ((by_q - target).abs().amax(dim=1) / scale).nan_to_num(float("inf"))
    k_err = ((by_k - target).abs().amax(dim=1) / scale).nan_to_num(float("inf"))
    best_q, best_k = int(q_err.argmin()), int(k_err.argmin())
    return (f"best q: row {best_q} (seq {best_q // next_n}, j {best_q % next_n}) err {q_err[best_q]:.2e}"
            f" [own {q_err[row]:.2e}]; best keys: seq {best_k} err {k_err[best_k]:.2e} [own {k_err[seq]:.2e}]")


def zeros_as_one(case: Case, ref, backend) -> None:
    """The caller-side workaround of docs/findings/deepgemm-zero-length-request.md: DeepGEMM given
    lengths with every 0 raised to 1 (its masks are not used; the true lengths mask the output)."""
    inputs = encode(case, backend.contract)
    raised = dataclasses.replace(inputs, context_lens=inputs.context_lens.clamp_min(1))
    got = backend(raised, None)
    limits = ref.row_lens.reshape(got.shape[0], 1)
    got = got.masked_fill(torch.arange(got.shape[1], device=got.device) >= limits, float("-inf"))
    c = compare(ref.logits, got, ref.row_lens, backend.contract, ref.bound)
    print(f"{backend.name} with zero lengths raised to 1, masked by the true lengths: {c.verdict.value} "
          f"value rows {c.value_rows[:12]} max rel {c.max_rel_err:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--name", default="random-mtp2-edges-bs64")
    parser.add_argument("--seed", type=int, default=4000)
    args = parser.parse_args()
    pairs = suite("random", 1, 0, (1, 2, 4), (64,), batch=64, max_model_len=131072, heads=64, head_dim=128)
    spec = next(s for s, seed in pairs if s.name == args.name and seed == args.seed)
    case = build_case(spec, args.seed, "cuda")
    ref = make_reference(case)
    lens = case.seq_lens.tolist()
    print(case.describe(), "pool blocks", case.k_pool.shape[0])
    print("sequence lengths:", lens)
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
        for row in c.value_rows[:12]:
            print(f"  row {row} (seq {row // case.next_n}, L {lens[row // case.next_n]}): "
                  f"{attribute(case, outs[-1], row)}")
        zeros_as_one(case, ref, backend)


if __name__ == "__main__":
    main()
