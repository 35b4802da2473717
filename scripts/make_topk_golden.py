"""Write tests/golden/topk/*.npz: small top-k cases and their truth, computed without difftest.

Plain Python over numpy float64: for each row, the values inside its window, ranked by sorted() with NaN
placed above +inf (nan "highest") or left out (nan "undefined"), -inf never a candidate; the truth is the
need-th largest candidate (need = min(k, candidates)), how many candidates lie above it and how many equal
it. Run from the project root: python scripts/make_topk_golden.py (rewrites the files; they are committed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "golden" / "topk"
NAN = math.nan
INF = math.inf


def truth(row: list[float], k: int, nan: str) -> dict[str, float]:
    """kth (as a float; NaN where a NaN is the k-th), above, equal, candidates and nans of one window."""
    nans = sum(1 for v in row if math.isnan(v))
    # A NaN ranked highest is drawn as a key above every float: (1, 0.0); others as (0, value).
    keys = [(1, 0.0) if math.isnan(v) else (0, v + 0.0) for v in row
            if not (math.isnan(v) and nan == "undefined") and v != -INF]
    keys.sort(reverse=True)
    need = min(k, len(keys))
    if need == 0:
        return {"kth": -INF, "above": 0, "equal": 0, "candidates": len(keys), "nans": nans}
    kth = keys[need - 1]
    return {"kth": NAN if kth[0] == 1 else kth[1], "above": sum(1 for key in keys if key > kth),
            "equal": sum(1 for key in keys if key == kth), "candidates": len(keys), "nans": nans}


def write(name: str, storage: list[list[float]], width: int, windows: list[tuple[int, int]], k: int,
          next_n: int = 1, nan: str = "highest") -> None:
    rows = [truth([float(v) for v in line[start:end]], k, nan)
            for line, (start, end) in zip(storage, windows, strict=True)]
    meta = {"name": name, "rows": len(storage), "row_stride": len(storage[0]), "width": width, "k": k,
            "next_n": next_n, "nan": nan}
    np.savez_compressed(
        OUT / f"{name}.npz", storage=np.array(storage, dtype=np.float32),
        starts=np.array([s for s, _ in windows], dtype=np.int64),
        ends=np.array([e for _, e in windows], dtype=np.int64),
        meta=np.array(json.dumps(meta)),
        **{f"expected_{field}": np.array([r[field] for r in rows], dtype=np.float64 if field == "kth" else np.int64)
           for field in ("kth", "above", "equal", "candidates", "nans")})


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261204)
    normal = rng.standard_normal((4, 40)).astype(np.float32).tolist()
    write("normal-windows", normal, 40, [(0, 40), (5, 30), (10, 13), (39, 40)], k=8)
    ties = [[3.0, 1.0, 1.0, 2.0, 1.0, 1.0, 0.5, 1.0, -1.0, 1.0],
            [1.0] * 10,
            [2.0, 2.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]
    write("ties-at-kth", ties, 10, [(0, 10), (2, 9), (0, 10), (1, 10)], k=4)
    few = [[1.0, -INF, 2.0, -INF, -INF, 3.0, -INF, -INF],
           [-INF] * 8,
           [4.0, 4.0, -INF, -INF, 0.0, -0.0, -INF, 7.0]]
    write("few-candidates", few, 8, [(0, 8), (0, 8), (0, 6)], k=4)
    special = [[INF, 1.0, NAN, -INF, 0.0, -0.0, INF, 2.0],
               [NAN, NAN, NAN, 1.0, 2.0, 3.0, 4.0, 5.0],
               [-0.0, 0.0, -0.0, 0.0, -1.0, 1.0, INF, -INF]]
    write("special-values", special, 8, [(0, 8), (0, 8), (0, 8)], k=3)
    write("special-values-nan-undefined", special, 8, [(0, 8), (0, 8), (0, 8)], k=3, nan="undefined")
    padded = [line[:10] + [3.0e38] * 3 for line in rng.integers(-3, 4, (3, 10)).astype(float).tolist()]
    write("padded-stride", padded, 10, [(0, 10), (3, 10), (0, 0)], k=5)
    decode = rng.standard_normal((4, 12)).astype(np.float32).tolist()  # two requests of L 7 and 12, next_n 2
    write("decode-next-n-2", decode, 12, [(0, 6), (0, 7), (0, 11), (0, 12)], k=6, next_n=2)


if __name__ == "__main__":
    main()
