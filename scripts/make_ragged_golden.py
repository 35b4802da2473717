"""Write tests/golden/ragged/*.npz: small ragged (prefill) MQA logits cases and their logits, computed without
difftest.

numpy and plain Python only: fp8 bytes decoded from their bit fields here (e4m3fn: bias 7, NaN at S.1111.111;
e4m3fnuz: bias 8, NaN at 0x80 alone), then for every row i and key p of its window [k_start, k_end)

    expected[i, p] = sum_h w[i, h] * max(sum_d q[i, h, d] * k[p, d], 0) * k_scale[p]

in float64, key by key; -inf at every other key. The members are those RaggedCase.save writes (q, k, k_scale,
weights, k_start, k_end, meta) plus `expected` (float64 [rows, keys], the ABSOLUTE form). Keys no window holds
are NaN canaries in two cases, which the oracle must never let through. Run from the project root:
python scripts/make_ragged_golden.py (rewrites the files; they are committed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "ragged"
NAN_BYTES = {"e4m3fn": (0x7F, 0xFF), "e4m3fnuz": (0x80,)}


def decode(byte: int, flavour: str) -> float:
    """The value of one fp8 byte, from its sign, 4 exponent and 3 mantissa bits."""
    if byte in NAN_BYTES[flavour]:
        return math.nan
    bias = 7 if flavour == "e4m3fn" else 8
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - bias)


def fp8_bytes(rng: np.random.Generator, shape: tuple[int, ...], flavour: str) -> np.ndarray:
    """Random fp8 bytes of every exponent, NaN bytes left out."""
    allowed = np.array([b for b in range(256) if b not in NAN_BYTES[flavour]], dtype=np.uint8)
    return rng.choice(allowed, size=shape)


def logits(q: np.ndarray, k: np.ndarray, scales: np.ndarray, weights: np.ndarray, windows: list[tuple[int, int]],
           flavour: str) -> np.ndarray:
    """float64 [rows, keys]: the formula, key by key inside each window, -inf elsewhere."""
    rows, heads, dim = q.shape
    out = np.full((rows, k.shape[0]), -math.inf)
    for i, (start, end) in enumerate(windows):
        for p in range(start, end):
            key = [decode(int(b), flavour) for b in k[p]]
            total = 0.0
            for h in range(heads):
                dot = sum(decode(int(q[i, h, d]), flavour) * key[d] for d in range(dim))
                total += float(weights[i, h]) * max(dot, 0.0)
            out[i, p] = total * float(scales[p])
    return out


def write(name: str, rng: np.random.Generator, heads: int, dim: int, keys: int, windows: list[tuple[int, int]],
          flavour: str = "e4m3fn", max_seqlen_k: int | None = None, scale_powers: bool = False) -> None:
    """One golden file: random bytes of every exponent, NaN canaries where no window reads, the logits."""
    rows = len(windows)
    q, k = fp8_bytes(rng, (rows, heads, dim), flavour), fp8_bytes(rng, (keys, dim), flavour)
    scales = (2.0 ** rng.integers(-10, 5, keys) if scale_powers else 0.5 + 1.5 * rng.random(keys)).astype(np.float32)
    weights = rng.standard_normal((rows, heads)).astype(np.float32)
    covered = np.zeros(keys, dtype=bool)
    for start, end in windows:
        covered[start:end] = True
    k[~covered] = NAN_BYTES[flavour][0]  # canaries: no window holds them
    scales[~covered] = np.nan
    expected = logits(q, k, scales, weights, windows, flavour)
    meta = {"name": name, "rows": rows, "keys": keys, "H": heads, "D": dim, "fp8": flavour,
            "max_seqlen_k": max_seqlen_k}
    np.savez_compressed(OUT / f"{name}.npz", q=q, k=k, k_scale=scales, weights=weights,
                        k_start=np.array([s for s, _ in windows], dtype=np.int64),
                        k_end=np.array([e for _, e in windows], dtype=np.int64), expected=expected,
                        meta=np.array(json.dumps(meta)))


def main() -> None:
    """The four golden cases, from one seeded generator (the same files every run)."""
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261205)
    write("windows-mixed", rng, heads=4, dim=32, keys=40,
          windows=[(0, 40), (5, 17), (10, 10), (39, 40), (0, 1), (20, 33)])
    # Chunked prefill: requests of context 3 then 2 query tokens, and context 5 then 3 (keys 0-4 and 5-12).
    write("staircase", rng, heads=8, dim=16, keys=13, windows=[(0, 4), (0, 5), (5, 11), (5, 12), (5, 13)])
    write("canaries-e4m3fnuz", rng, heads=2, dim=16, keys=24, windows=[(2, 7), (15, 16), (15, 20), (3, 3)],
          flavour="e4m3fnuz")
    write("heavy-scales-max-seqlen-k", rng, heads=16, dim=32, keys=30,
          windows=[(0, 9), (4, 13), (21, 30), (29, 29)], max_seqlen_k=12, scale_powers=True)


if __name__ == "__main__":
    main()
