"""Shared test helpers: the golden directory, an independent fp8 decoder, a slow loop reference,
tiny specs that cover the edges, and a logits comparison that prints where it fails."""

from __future__ import annotations

import contextlib
import io
import math
import struct
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from difftest.cli import main
from difftest.core.case import Case
from difftest.core.kinds import Fp8Flavour
from difftest.generators import CaseSpec, LengthDist, Stale, Values

REPO_ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
GOLDEN_MISSING = f"golden cases not found: {GOLDEN_DIR} does not exist"


def golden_files() -> list[Path]:
    return sorted(GOLDEN_DIR.glob("*.npz")) if GOLDEN_DIR.is_dir() else []


def golden_params() -> list:
    """pytest params over the golden files; one skipped param with the reason when they are absent."""
    files = golden_files()
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=GOLDEN_MISSING), id="golden-missing")]
    return [pytest.param(path, id=path.stem) for path in files]


# --------------------------------------------------------------------------- fp8, bit by bit

def fp8_value(byte: int, flavour: Fp8Flavour) -> float:
    """The value of one e4m3 byte, from the bit fields (not through torch's float8 dtypes)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if flavour == Fp8Flavour.E4M3FN:
        if exponent == 0xF and mantissa == 0x7:
            return math.nan
        bias = 7
    else:
        if byte == 0x80:
            return math.nan
        bias = 8
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** (1 - bias)
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - bias)


FP8_TABLES = {f: [fp8_value(b, f) for b in range(256)] for f in Fp8Flavour}


def decode_bytes(raw: torch.Tensor, flavour: Fp8Flavour) -> list:
    """Nested lists of float values of a uint8 tensor, decoded by FP8_TABLES."""
    table = FP8_TABLES[flavour]

    def walk(x: list | int) -> list | float:
        return [walk(v) for v in x] if isinstance(x, list) else table[x]

    return walk(raw.tolist())  # type: ignore[return-value]


# --------------------------------------------------------------------------- slow reference

def slow_reference(case: Case, rows: list[int] | None = None, positions: list[int] | None = None) -> dict:
    """{(row, position): logit} straight from the formula of docs/reference/kernel.md, one element at a time, float64.

    limit = max(L_b - next_n + j + 1, 0); key p of sequence b is slot p % block_size of physical
    block block_table[b, p // block_size]; logit = sum_h w[r, h] * relu(q[b, j, h] . k) * s.
    """
    q = decode_bytes(case.q, case.fp8)
    keys = decode_bytes(case.k_pool, case.fp8)
    scales = case.scale_pool.double().tolist()
    weights = case.weights.double().tolist()
    table = case.block_table.tolist()
    seq_lens = case.seq_lens.tolist()
    next_n, block_size = case.next_n, case.block_size
    out = {}
    for row in range(case.rows) if rows is None else rows:
        b, j = divmod(row, next_n)
        limit = max(seq_lens[b] - next_n + j + 1, 0)
        for p in range(case.max_model_len) if positions is None else positions:
            if p >= limit:
                out[row, p] = -math.inf
                continue
            block, slot = table[b][p // block_size], p % block_size
            key, scale = keys[block][slot], scales[block][slot]
            terms = []
            for h in range(case.heads):
                dot = math.fsum(qd * kd for qd, kd in zip(q[b][j][h], key, strict=True))
                terms.append(weights[row][h] * max(dot, 0.0) * scale)
            out[row, p] = math.fsum(terms)
    return out


# --------------------------------------------------------------------------- comparing logits

def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a float32 tensor (NaN canaries then compare equal); other dtypes as they are."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same_logits(got: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    """Identical -inf pattern, no NaN, and |got - expected| <= rel * (largest finite |expected|)."""
    assert got.shape == expected.shape, f"{what}: {tuple(got.shape)=} != {tuple(expected.shape)=}"
    got, expected = got.double(), expected.double()
    neg_got, neg_exp = torch.isneginf(got), torch.isneginf(expected)
    if not torch.equal(neg_got, neg_exp):
        row, pos = torch.nonzero(neg_got != neg_exp)[0].tolist()
        raise AssertionError(f"{what}: -inf pattern differs first at {row=}, {pos=}: "
                             f"got={got[row, pos].item()}, expected={expected[row, pos].item()}")
    assert not torch.isnan(got).any(), f"{what}: NaN at {torch.nonzero(torch.isnan(got))[:4].tolist()}"
    finite = torch.isfinite(expected)
    if not finite.any():
        return
    scale = float(expected[finite].abs().max()) or 1.0
    diff = (got - expected)[finite].abs()
    worst = float(diff.max())
    if worst > rel * scale:
        row, pos = torch.nonzero(torch.where(finite, (got - expected).abs(), 0.0) == worst)[0].tolist()
        raise AssertionError(f"{what}: |got - expected| = {worst} > {rel} * {scale} at {row=}, {pos=}: "
                             f"got={got[row, pos].item()}, expected={expected[row, pos].item()}")


# --------------------------------------------------------------------------- tiny specs

TINY = CaseSpec(name="tiny", batch=3, heads=2, head_dim=16, block_size=4, max_model_len=20)

# Small enough that the slow loop reference takes a few milliseconds each; together they reach
# lengths 0, 1, < next_n, block boundaries +-1, max_model_len, padding, shared blocks, stale
# entries of every kind, heavy and integer values, e4m3fnuz, block sizes 1, 3 and max_model_len.
TINY_SPECS = [
    TINY.replace(name="uniform-mtp1"),
    TINY.replace(name="uniform-mtp3", next_n=3),
    TINY.replace(name="edges-mtp1", length_dist=LengthDist.EDGES),
    TINY.replace(name="edges-mtp2", next_n=2, length_dist=LengthDist.EDGES),
    TINY.replace(name="edges-mtp4", next_n=4, length_dist=LengthDist.EDGES),
    TINY.replace(name="short-mtp3", next_n=3, length_dist=LengthDist.SHORT),
    TINY.replace(name="full-mtp2", next_n=2, length_dist=LengthDist.FULL, batch=2),
    TINY.replace(name="explicit-lengths", next_n=3, lengths=(0, 1, 2, 3, 4, 5, 20)),
    TINY.replace(name="padding-other", next_n=2, padding=2, stale=Stale.OTHER),
    TINY.replace(name="padding-zero", next_n=2, padding=2, stale=Stale.ZERO, extra_columns=2),
    TINY.replace(name="shared-blocks", next_n=2, shared_blocks=True, length_dist=LengthDist.EDGES, batch=4),
    TINY.replace(name="stale-canary-overhang", next_n=3, extra_columns=1, stale=Stale.CANARY, canary_blocks=3),
    TINY.replace(name="heavy", next_n=2, values=Values.HEAVY),
    TINY.replace(name="integer", next_n=2, values=Values.INTEGER),
    TINY.replace(name="e4m3fnuz", next_n=2, fp8=Fp8Flavour.E4M3FNUZ, length_dist=LengthDist.EDGES),
    TINY.replace(name="block1", next_n=2, block_size=1, max_model_len=12),
    TINY.replace(name="block3-odd", next_n=3, block_size=3, max_model_len=13, length_dist=LengthDist.EDGES),
    TINY.replace(name="block-eq-mml", next_n=2, block_size=20, length_dist=LengthDist.EDGES),
]


# An operation other than paged logits -> a backend of it that runs on the CPU, and one that cannot (it SKIPs)
CPU_OPERATION_BACKENDS = {"topk": ("torch-topk", "vllm-top-k-per-row-decode"),
                          "ragged-logits": ("aiter-triton-ragged", "deepgemm-ragged"),
                          "indexer": ("torch+torch-topk", "deepgemm+vllm-cooperative-topk"),
                          "prefill-indexer": ("aiter-triton-ragged+torch-topk", "deepgemm-ragged+torch-topk")}


def operation_rows(command: str, rows: list[tuple[list[str], str]]) -> list:
    """(argv, what the line says) of each row for every operation other than paged logits, its backend in `{b}`."""
    return [pytest.param([command, "--op", op, *(a.format(b=backends[0]) for a in argv)],
                         says.format(b=backends[0]), id=f"{op}-{' '.join(argv)}")
            for op, backends in CPU_OPERATION_BACKENDS.items() for argv, says in rows]


def operation_bundle(op: str, where: Path) -> Path:
    """A bundle of `op`'s first suite case through its CPU backend (CPU_OPERATION_BACKENDS), written as a run
    writes one."""
    from difftest.backends import Origin  # deferred: the operations load their backends' tables
    from difftest.core.kinds import OperationKind
    from difftest.engine.config import RunConfig
    from difftest.engine.operation_run import run_one
    from difftest.operations import operation
    from difftest.records.bundle import write_bundle
    from difftest.workflows.operation_session import chosen_backends

    kind = operation(OperationKind(op))
    named = chosen_backends(kind, CPU_OPERATION_BACKENDS[op][:1])[0]
    case = kind.build(kind.suite()[0], 0, "cpu")
    return write_bundle(where, case, run_one(kind, named, case, RunConfig()), RunConfig(),
                        Origin(named.name, registered=True))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """difftest.cli.main(argv) in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- archives written by hand

def handmade_zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED, declared: dict | None = None,
                 flags: int = 0, trailing: dict | None = None) -> bytes:
    """A zip written by hand, so a member may declare any size and carry bytes past what it declares."""
    out, central = bytearray(), bytearray()
    for name, data in members:
        raw = data + (trailing or {}).get(name, b"")
        if method == zipfile.ZIP_DEFLATED:
            squeeze = zlib.compressobj(6, zlib.DEFLATED, -15)
            body = squeeze.compress(raw) + squeeze.flush()
        else:
            body = raw
        size, crc, encoded = (declared or {}).get(name, len(data)), zlib.crc32(data), name.encode()
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, flags, method, 0, 0, crc, len(body), size, len(encoded), 0)
        out += encoded + body
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, flags, method, 0, 0, crc, len(body), size,
                               len(encoded), 0, 0, 0, 0, 0, offset) + encoded
    count = len(members)
    return bytes(out + central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), len(out), 0))
