"""The canonical paged MQA logits problem, independent of any kernel's encoding or device.

A Case holds the physical key pool exactly as a paged KV cache holds it (so shared blocks, stale
block-table entries and canary blocks are part of the problem), the one true causal limit of every
query row, and nothing that depends on a backend: no length encoding, no byte layout.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from difftest.core.case_archive import CaseMeta, check_case_archive
from difftest.core.errors import SpecError, require
from difftest.core.fp8 import decode
from difftest.core.kinds import CacheLayout, Fp8Flavour
from difftest.core.layout import pack_cache, unpack_cache
from difftest.core.schema import one_line, shown, to_jsonable
from difftest.core.spec import CaseSpec


def row_limits(seq_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """(B, next_n) causal limits: row j of sequence b sees max(L_b - next_n + j + 1, 0) keys."""
    offsets = torch.arange(next_n, device=seq_lens.device) - next_n + 1
    return (seq_lens.to(torch.int64)[:, None] + offsets).clamp(min=0)


@dataclasses.dataclass(frozen=True, repr=False)
class Case:
    """One problem. Row r = b * next_n + j is draft position j of sequence b."""

    name: str
    q: torch.Tensor  # uint8 [B, next_n, H, D]: fp8 bytes
    k_pool: torch.Tensor  # uint8 [num_blocks, block_size, D]: fp8 bytes of every physical slot
    scale_pool: torch.Tensor  # float32 [num_blocks, block_size]: per-token dequant scales
    weights: torch.Tensor  # float32 [B * next_n, H]
    block_table: torch.Tensor  # int32 [B, W]: physical block of each logical block
    seq_lens: torch.Tensor  # int64 [B]: L_b, tokens of sequence b including its next_n queries
    max_model_len: int
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def next_n(self) -> int:
        return self.q.shape[1]

    @property
    def heads(self) -> int:
        return self.q.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    @property
    def block_size(self) -> int:
        return self.k_pool.shape[1]

    @property
    def rows(self) -> int:
        return self.batch * self.next_n

    @functools.cached_property
    def lengths(self) -> tuple[int, ...]:
        """seq_lens as Python ints, read back once: on a GPU every read is a host wait, and each result
        of a case (its description, its reach) reads them."""
        return tuple(self.seq_lens.tolist())

    @property
    def pool_bytes(self) -> int:
        """Bytes of the cache a kernel is handed: num_blocks * block_size * (D + 4)."""
        return self.k_pool.shape[0] * self.block_size * (self.head_dim + 4)

    @property
    def device(self) -> torch.device:
        return self.q.device

    def row_lens(self) -> torch.Tensor:
        """(B, next_n) int64: the truth every length encoding is derived from."""
        return row_limits(self.seq_lens, self.next_n)

    def used_blocks(self) -> torch.Tensor:
        """(B,) number of block-table columns each sequence actually uses."""
        return (self.seq_lens + self.block_size - 1) // self.block_size

    def q_values(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return decode(self.q, self.fp8, dtype)

    def k_values(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return decode(self.k_pool, self.fp8, dtype)

    def to(self, device: str | torch.device) -> Case:
        """The same case with every tensor on `device` (this case where they all are already)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        if all(tensor is getattr(self, name) for name, tensor in moved.items()):
            return self
        return self.lengths_to(dataclasses.replace(self, **moved))

    def knowing_lengths(self, lengths: Sequence[int]) -> Case:
        """This case, its `lengths` given by a caller that holds them on the host already (what drew them):
        read back from a GPU, each case's own read is a host wait (a campaign's batch has 64 members)."""
        object.__setattr__(self, "lengths", tuple(int(length) for length in lengths))  # cached_property's slot
        return self

    @property
    def known_lengths(self) -> tuple[int, ...] | None:
        """The lengths where they are on the host already (read back or given), else None: no host wait."""
        return self.__dict__.get("lengths")

    def lengths_to(self, other: Case) -> Case:
        """`other` (a copy of this case), knowing this case's lengths where this one knows them."""
        known = self.known_lengths
        return other if known is None else other.knowing_lengths(known)

    def __repr__(self) -> str:
        # pytest prints fixture values of a failing test: a line, not megabytes of tensors.
        return f"Case({self.name!r}, {self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How hypothesis (and IPython) print a case: the call that draws it again, else repr's line.
        Their pretty-printer would otherwise lay the dataclass out field by field, every tensor in full."""
        printer.text(self.recipe() or repr(self))

    def recipe(self) -> str | None:
        """`build_case(CaseSpec.from_json({...}), seed)` for a case drawn from a spec (meta 'spec' and
        'seed'), with the spec's name and the fields that differ from CaseSpec's defaults; None for one
        built some other way."""
        spec, seed = self.meta.get("spec"), self.meta.get("seed")
        if not isinstance(spec, dict) or not isinstance(seed, int):
            return None
        defaults = to_jsonable(CaseSpec())
        fields = {k: v for k, v in spec.items() if k == "name" or defaults.get(k) != v}
        device = "" if self.device.type == "cpu" else f", device={str(self.device)!r}"
        return f"build_case(CaseSpec.from_json({fields!r}), {seed}{device})"

    def describe(self) -> str:
        """One line: the structure a kernel engineer reads first."""
        lens = list(self.lengths)
        shown = lens if len(lens) <= 8 else [*lens[:8], "..."]
        return (f"B={self.batch} next_n={self.next_n} H={self.heads} D={self.head_dim} "
                f"block={self.block_size} max_model_len={self.max_model_len} fp8={self.fp8.value} "
                f"L={shown}")

    def validate(self) -> Case:
        """Check every field against the others; SpecError names the first one that is impossible."""
        self.validate_layout()
        checks = _value_checks(self)
        # Read back from the device at once (on a GPU each check read back alone was a host wait).
        for holds, (_, fail) in zip(torch.stack([held for held, _ in checks]).tolist(), checks, strict=True):
            if not holds:
                fail()
        return self

    def validate_layout(self) -> Case:
        """validate()'s checks that read no tensor's values (types, devices, shapes, dtypes): host work only."""
        _validate_types(self)
        _validate_shapes(self)
        require(self.max_model_len >= 1, "max_model_len", self.max_model_len, "an integer >= 1")
        return self

    def save(self, path: str | Path) -> Path:
        """Write the case as an .npz in the golden-file format (block-split bytes plus a JSON meta)."""
        path = Path(path)
        meta = CaseMeta.from_json({**self.meta, "name": self.name, "B": self.batch, "next_n": self.next_n,
                                   "H": self.heads, "D": self.head_dim, "block_size": self.block_size,
                                   "max_model_len": self.max_model_len, "layout": CacheLayout.BLOCK_SPLIT.value,
                                   "fp8": self.fp8.value, "seq_lens": self.seq_lens.tolist()}, "meta.")
        case = self.to("cpu")
        np.savez_compressed(
            path, q=case.q.numpy(), weights=case.weights.numpy(),
            kv_cache=pack_cache(case.k_pool, case.scale_pool, CacheLayout.BLOCK_SPLIT).numpy(),
            context_lens=case.row_lens().to(torch.int32).numpy(),
            block_table=case.block_table.numpy(), meta=np.array(json.dumps(meta.to_json())))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Case:
        """Read a case written by save(), or one of the golden cases in tests/golden.

        The archive is checked first (difftest.core.case_archive.check_case_archive): its members, their shapes
        and dtypes against its meta and their declared sizes, before any array is decompressed. A file
        that does not fit is a SpecError naming the path and what is wrong, never another exception.
        """
        meta = check_case_archive(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: torch.from_numpy(z[k].copy()) for k in z.files if k not in ("meta", "expected")}
        # A member torn after its header, or too large for this machine:
        except (OSError, ValueError, EOFError, MemoryError, zipfile.BadZipFile, zlib.error) as exc:
            raise SpecError(one_line(str(path)), str(path), f"a case archive whose arrays read back "
                            f"({type(exc).__name__}: {one_line(str(exc))[:200]})") from None
        k_pool, scale_pool = unpack_cache(arrays["kv_cache"], meta.D, meta.layout)
        case = cls(name=meta.name, q=arrays["q"], k_pool=k_pool, scale_pool=scale_pool,
                   weights=arrays["weights"], block_table=arrays["block_table"],
                   seq_lens=torch.tensor(meta.seq_lens, dtype=torch.int64),
                   max_model_len=meta.max_model_len, fp8=meta.fp8, meta=meta.case_meta)
        stored = arrays["context_lens"].to(torch.int64)
        require(torch.equal(stored, case.row_lens()), "context_lens", shown(stored.tolist()),
                f"the per-row limits of seq_lens {shown(meta.seq_lens)!r}")
        return case.validate()


def select_sequences(case: Case, keep: Sequence[int]) -> Case:
    """The case made of sequences `keep` (in that order): q, weights, table and lengths sliced together.

    The key pool is kept whole, so block ids (and stale entries) mean what they meant
    (difftest.workflows.shrink.compact_pool drops the blocks nobody references).
    """
    index = torch.tensor(list(keep), dtype=torch.int64, device=case.device)
    rows = (index[:, None] * case.next_n + torch.arange(case.next_n, device=case.device)).flatten()
    return dataclasses.replace(case, q=case.q[index], weights=case.weights[rows],
                               block_table=case.block_table[index], seq_lens=case.seq_lens[index])


_TENSORS = ("q", "k_pool", "scale_pool", "weights", "block_table", "seq_lens")
_INDEX_DTYPES = (torch.int32, torch.int64)


def _validate_types(case: Case) -> None:
    """Tensors where tensors belong, all on one cpu or cuda device; plain values of the right type."""
    require(isinstance(case.name, str), "name", case.name, "a str")
    for field in _TENSORS:
        value = getattr(case, field)
        require(isinstance(value, torch.Tensor), field, type(value).__name__, "a torch.Tensor")
    device = case.q.device
    require(device.type in ("cpu", "cuda"), "q.device", str(device), "a cpu or cuda device")
    for field in _TENSORS[1:]:
        require(getattr(case, field).device == device, f"{field}.device", str(getattr(case, field).device),
                f"q's device, {device}")
    require(isinstance(case.max_model_len, int) and not isinstance(case.max_model_len, bool), "max_model_len",
            case.max_model_len, "an int")
    require(isinstance(case.fp8, Fp8Flavour), "fp8", case.fp8, f"a difftest.Fp8Flavour {[f.value for f in Fp8Flavour]}")


def _validate_shapes(case: Case) -> None:
    require(case.q.dim() == 4, "q.shape", tuple(case.q.shape), "[B, next_n, H, D]")
    require(case.q.dtype == torch.uint8, "q.dtype", case.q.dtype, "torch.uint8 (fp8 bytes)")
    require(case.next_n >= 1, "next_n", case.next_n, "an integer >= 1")
    require(case.head_dim % 16 == 0 and case.head_dim > 0, "D", case.head_dim,
            "a positive multiple of 16")
    require(case.k_pool.dim() == 3 and case.k_pool.shape[2] == case.head_dim, "k_pool.shape",
            tuple(case.k_pool.shape), f"[num_blocks, block_size, D={case.head_dim}]")
    require(case.k_pool.dtype == torch.uint8, "k_pool.dtype", case.k_pool.dtype, "torch.uint8")
    require(case.scale_pool.shape == case.k_pool.shape[:2], "scale_pool.shape",
            tuple(case.scale_pool.shape), f"{tuple(case.k_pool.shape[:2])}")
    require(case.scale_pool.dtype == torch.float32, "scale_pool.dtype", case.scale_pool.dtype,
            "torch.float32")
    require(tuple(case.weights.shape) == (case.rows, case.heads), "weights.shape",
            tuple(case.weights.shape), f"[B * next_n, H] = {(case.rows, case.heads)}")
    require(case.weights.dtype == torch.float32, "weights.dtype", case.weights.dtype,
            "torch.float32")
    require(case.block_table.dim() == 2 and case.block_table.shape[0] == case.batch,
            "block_table.shape", tuple(case.block_table.shape), f"[B={case.batch}, W]")
    require(case.block_table.dtype in _INDEX_DTYPES, "block_table.dtype", case.block_table.dtype,
            "torch.int32 or torch.int64")
    require(case.seq_lens.dtype in _INDEX_DTYPES, "seq_lens.dtype", case.seq_lens.dtype, "torch.int32 or torch.int64")
    require(tuple(case.seq_lens.shape) == (case.batch,), "seq_lens.shape",
            tuple(case.seq_lens.shape), f"[B] = ({case.batch},)")


def _value_checks(case: Case) -> list[tuple[torch.Tensor, Callable[[], None]]]:
    """Each check of the case's values, in order: whether it holds (a bool on the case's device) and
    what raises its SpecError. Weights are finite; lengths are in [0, max_model_len] and the table is
    wide enough for them; every block a sequence uses exists, and every key it can see has a positive
    finite scale."""
    lens, table, block_size = case.seq_lens, case.block_table, case.block_size
    num_blocks, width = case.k_pool.shape[0], table.shape[1] * block_size
    finite = torch.isfinite(case.weights)
    used = torch.arange(table.shape[1], device=case.device)[None, :] < case.used_blocks()[:, None]
    positions = torch.arange(width, device=case.device)
    visible = positions[None, :] < lens[:, None]
    if num_blocks:
        scales = case.scale_pool[table.clamp(0, num_blocks - 1).repeat_interleave(block_size, dim=1),
                                 positions % block_size]
        good_scales = (scales > 0) & torch.isfinite(scales)
    else:  # no block to read a scale from: no key may be visible
        scales, good_scales = torch.zeros_like(visible, dtype=torch.float32), torch.zeros_like(visible)

    def too_narrow() -> None:
        longest = int(lens.max())
        require(False, "block_table.shape", tuple(table.shape),
                f"at least {-(-longest // block_size)} columns for a length of {longest} with block_size {block_size}")

    return [
        (finite.all(), lambda: require(False, "weights", case.weights[~finite][:4].tolist(), "finite weights")),
        ((lens >= 0).all(), lambda: require(False, "seq_lens", lens.tolist(), "every length >= 0")),
        ((lens <= case.max_model_len).all(),
         lambda: require(False, "seq_lens", lens.tolist(), f"every length <= max_model_len = {case.max_model_len}")),
        ((lens <= width).all(), too_narrow),
        ((((table >= 0) & (table < num_blocks)) | ~used).all(),
         lambda: require(False, "block_table", table[used].tolist()[:16],
                         f"block ids in [0, {num_blocks}) for every used column")),
        ((good_scales | ~visible).all(),
         lambda: require(False, "scale_pool", scales[visible & ~good_scales][:4].tolist(),
                         "positive finite scales for every visible key")),
    ]
