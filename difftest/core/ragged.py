"""The ragged (prefill) MQA logits operation: its canonical problem (RaggedCase), what a kernel declares
(RaggedContract) and what a kernel is handed (RaggedInputs), the siblings of Case, Contract and KernelInputs
for paged logits (docs/reference/ragged.md).

A RaggedCase is q [rows, H, D] fp8, one contiguous fp8 key buffer k [keys, D] with one fp32 scale per key,
weights [rows, H] and, per query row, a key window [k_start, k_end). Row i's logit of key p is

    sum_h w[i, h] * relu(q[i, h, :] . k[p, :]) * k_scale[p]        for k_start[i] <= p < k_end[i]

and nothing (-inf, where a kernel cleans) elsewhere. How a kernel lays its output out is its contract's
LogitsForm: ABSOLUTE, [rows, keys] with column p holding key p, or WINDOW_RELATIVE, [rows, max_seqlen_k] with
column j holding key k_start + j (DeepGEMM 2.8's compressed logits). The case holds the windows themselves,
and `max_seqlen_k` as a caller would pass it to a kernel that takes one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from difftest.core import hardware
from difftest.core.case_archive import (
    IN_CASE_META,
    META_CHARS_PER_REQUEST,
    META_FIXED_CHARS,
    META_MEMBER,
    ArchiveMeta,
    MemberHeader,
    MemberRule,
    check_archive,
    check_shapes,
    read_arrays,
    read_meta,
)
from difftest.core.errors import SpecError, require
from difftest.core.fp8 import convert, decode, nan_bytes
from difftest.core.kinds import Fp8Flavour, LogitsForm, MaskConvention, OperationKind
from difftest.core.schema import MAX_HEADS, MAX_NAME, HeadDim, Int, Member, Rule, Seed, Text, one_line

MAX_ROWS = 1 << 20  # query rows of a case
MAX_KEYS = 1 << 26  # keys of a case: 2^31 bytes of keys are 2^24 keys at D 128; four times that
TOPK_K_MEMBER = "topk_k"  # a prefill indexer case's k (difftest.core.indexer.PrefillIndexerCase), an int64 scalar
# The arrays of a ragged case archive, then every member its archive may hold: golden files add `expected`.
_ARRAYS = ("q", "k", "k_scale", "weights", "k_start", "k_end")
_MEMBERS = {"q": MemberRule(("|u1",), "[rows, H, D] uint8 (fp8 bytes)"),
            "k": MemberRule(("|u1",), "[keys, D] uint8 (fp8 bytes)"), "k_scale": MemberRule(("<f4",), "[keys] float32"),
            "weights": MemberRule(("<f4",), "[rows, H] float32"), "k_start": MemberRule(("<i8",), "[rows] int64"),
            "k_end": MemberRule(("<i8",), "[rows] int64"), META_MEMBER: MemberRule((), "a JSON string"),
            "expected": MemberRule(("<f8",), "[rows, keys] float64 (a golden file's logits)", optional=True),
            TOPK_K_MEMBER: MemberRule(("<i8",), "an int64 scalar: the k of the top-k stage", optional=True)}


def covered_keys(k_start: torch.Tensor, k_end: torch.Tensor, keys: int) -> torch.Tensor:
    """bool [keys]: the keys inside at least one window [k_start[i], k_end[i]) (a difference array, no loop)."""
    marks = torch.zeros(keys + 1, dtype=torch.int64, device=k_start.device)
    nonempty = k_end > k_start
    marks.index_add_(0, k_start[nonempty], torch.ones_like(k_start[nonempty]))
    marks.index_add_(0, k_end[nonempty], -torch.ones_like(k_end[nonempty]))
    return marks.cumsum(0)[:keys] > 0


@dataclasses.dataclass(frozen=True, repr=False)
class RaggedCase:
    """One ragged logits problem: row i scores the keys of its window [k_start[i], k_end[i])."""

    name: str
    q: torch.Tensor  # uint8 [rows, H, D]: fp8 bytes
    k: torch.Tensor  # uint8 [keys, D]: fp8 bytes of the contiguous key buffer
    k_scale: torch.Tensor  # float32 [keys]: each key's dequant scale
    weights: torch.Tensor  # float32 [rows, H]
    k_start: torch.Tensor  # int64 [rows]: first key of each row's window
    k_end: torch.Tensor  # int64 [rows]: one past its last key
    # The output width a caller passes to a WINDOW_RELATIVE kernel; None: the longest window.
    max_seqlen_k: int | None = None
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.q.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def keys(self) -> int:
        return self.k.shape[0]

    @property
    def device(self) -> torch.device:
        return self.q.device

    def window_lens(self) -> torch.Tensor:
        """int64 [rows]: k_end - k_start of each row."""
        return self.k_end - self.k_start

    @functools.cached_property
    def longest(self) -> int:
        """The longest window, read back once (on a GPU every read is a host wait)."""
        return int(self.window_lens().max()) if self.rows else 0

    @property
    def seqlen_k(self) -> int:
        """The max_seqlen_k a caller passes: the case's own, else the longest window (at least 1: DeepGEMM
        asserts max_seqlen_k > 0)."""
        return self.max_seqlen_k if self.max_seqlen_k is not None else max(1, self.longest)

    def q_values(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """q's values, decoded from its fp8 flavour, as `dtype`."""
        return decode(self.q, self.fp8, dtype)

    def k_values(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The keys' values (NaN canaries included), decoded, as `dtype`."""
        return decode(self.k, self.fp8, dtype)

    def covered(self) -> torch.Tensor:
        """bool [keys]: the keys some row's window holds."""
        return covered_keys(self.k_start, self.k_end, self.keys)

    def to(self, device: str | torch.device) -> RaggedCase:
        """The same case with every tensor on `device` (this case where they all are already)."""
        if self.q.device == torch.device(device):
            return self
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **moved)

    def __repr__(self) -> str:
        # pytest prints fixture values of a failing test: a line, not megabytes of tensors.
        return f"RaggedCase({self.name!r}, {self.describe()})"

    def describe(self) -> str:
        """One line: the structure a kernel engineer reads first."""
        windows = list(zip(self.k_start.tolist()[:6], self.k_end.tolist()[:6], strict=True))
        shown = [f"[{s},{e})" for s, e in windows] + (["..."] if self.rows > 6 else [])
        width = "" if self.max_seqlen_k is None else f" max_seqlen_k={self.max_seqlen_k}"
        return (f"rows={self.rows} keys={self.keys} H={self.heads} D={self.head_dim} fp8={self.fp8.value}{width} "
                f"windows={' '.join(shown)}")

    def validate(self) -> RaggedCase:
        """Check every field against the others; SpecError names the first one that is impossible."""
        _validate_types(self)
        _validate_shapes(self)
        _validate_values(self)
        return self

    def save(self, path: str | Path, **extra: np.ndarray) -> Path:
        """Write the case as an .npz (its tensors and its meta, RaggedMeta); `extra` members are written beside
        them (a golden file's `expected`). SpecError naming a meta key RaggedMeta has no field for."""
        path = Path(path)
        meta = RaggedMeta.from_json({**self.meta, "name": self.name, "rows": self.rows, "keys": self.keys,
                                     "H": self.heads, "D": self.head_dim, "fp8": self.fp8.value,
                                     "max_seqlen_k": self.max_seqlen_k}, "meta.")
        case = self.to("cpu")
        arrays = {member: getattr(case, member).numpy() for member in _ARRAYS}
        np.savez_compressed(path, **arrays, **extra, meta=np.array(json.dumps(meta.to_json())))
        return path

    @classmethod
    def load(cls, path: str | Path) -> RaggedCase:
        """Read a case written by save() (or a golden file of tests/golden/ragged). Members are checked against
        the meta's sizes before any is decompressed; a file that does not fit is a SpecError naming the path
        and what is wrong, never another exception."""
        meta, arrays = _read_archive(Path(path))
        case = cls(name=meta.name, q=torch.from_numpy(arrays["q"]), k=torch.from_numpy(arrays["k"]),
                   k_scale=torch.from_numpy(arrays["k_scale"]), weights=torch.from_numpy(arrays["weights"]),
                   k_start=torch.from_numpy(arrays["k_start"]), k_end=torch.from_numpy(arrays["k_end"]),
                   max_seqlen_k=meta.max_seqlen_k, fp8=meta.fp8, meta=meta.case_meta)
        return case.validate()


SpecJson = Rule(lambda v: type(v) is dict,
                "a JSON object: the spec the case was drawn from (RaggedSpec.to_json)").type(dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RaggedMeta(ArchiveMeta):
    """The `meta` of a ragged case archive, its one definition: what RaggedCase.meta held (a drawn case's seed
    and spec), then the structure of its arrays. RaggedCase.save writes it (to_json: the fields RaggedCase.meta
    does not hold are left out), RaggedCase.load reads it."""

    what = "a JSON object of ragged case meta fields"
    seed: Seed | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    spec: SpecJson | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    name: Text(MAX_NAME)
    rows: Int(1, MAX_ROWS)
    keys: Int(1, MAX_KEYS)
    H: Int(1, MAX_HEADS)
    D: HeadDim
    fp8: Member(Fp8Flavour)
    max_seqlen_k: Int(1, MAX_KEYS) | None  # written as null where the case has none


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(values: list[Any]) -> str:
    return repr(values if len(values) <= 8 else [*values[:8], "..."])


def _validate_types(case: RaggedCase) -> None:
    """Tensors where tensors belong, all on one cpu or cuda device; plain values of the right type."""
    require(isinstance(case.name, str), "name", case.name, "a str")
    for field in _ARRAYS:
        value = getattr(case, field)
        require(isinstance(value, torch.Tensor), field, type(value).__name__, "a torch.Tensor")
    device = case.q.device
    require(device.type in ("cpu", "cuda"), "q.device", str(device), "a cpu or cuda device")
    for field in _ARRAYS[1:]:
        require(getattr(case, field).device == device, f"{field}.device", str(getattr(case, field).device),
                f"q's device, {device}")
    require(case.max_seqlen_k is None or (_is_int(case.max_seqlen_k) and case.max_seqlen_k >= 1), "max_seqlen_k",
            case.max_seqlen_k, "None or an integer >= 1")
    require(isinstance(case.fp8, Fp8Flavour), "fp8", case.fp8, f"a difftest.Fp8Flavour {[f.value for f in Fp8Flavour]}")


def _validate_shapes(case: RaggedCase) -> None:
    require(case.q.dim() == 3 and case.q.shape[0] >= 1 and case.q.shape[1] >= 1, "q.shape", tuple(case.q.shape),
            "[rows >= 1, H >= 1, D]")
    require(case.head_dim % 16 == 0 and case.head_dim > 0, "D", case.head_dim, "a positive multiple of 16")
    expected = {"q": ((case.rows, case.heads, case.head_dim), torch.uint8, "uint8 (fp8 bytes)"),
                "k": ((case.keys, case.head_dim), torch.uint8, "uint8 (fp8 bytes)"),
                "k_scale": ((case.keys,), torch.float32, "float32"),
                "weights": ((case.rows, case.heads), torch.float32, "float32"),
                "k_start": ((case.rows,), torch.int64, "int64"), "k_end": ((case.rows,), torch.int64, "int64")}
    require(case.k.dim() == 2 and case.keys >= 1, "k.shape", tuple(case.k.shape), f"[keys >= 1, D = {case.head_dim}]")
    for field, (shape, dtype, words) in expected.items():
        value = getattr(case, field)
        require(tuple(value.shape) == shape, f"{field}.shape", tuple(value.shape), f"{list(shape)}")
        require(value.dtype == dtype, f"{field}.dtype", value.dtype, f"torch.{words}")


def _validate_values(case: RaggedCase) -> None:
    """Windows inside the buffer; finite weights; every key a window holds has a positive finite scale and
    key bytes that are no NaN (keys no window holds may be anything: the generators fill them with NaN)."""
    starts, ends = case.k_start, case.k_end
    inside = torch.stack([(starts >= 0).all(), (starts <= ends).all(), (ends <= case.keys).all()]).tolist()
    require(all(inside), "k_start, k_end", _shown(list(zip(starts.tolist(), ends.tolist(), strict=True))),
            f"0 <= k_start <= k_end <= keys = {case.keys} in every row")
    covered = case.covered()
    bad_scale = covered & ~((case.k_scale > 0) & torch.isfinite(case.k_scale))
    bad_key = covered & nan_bytes(case.k, case.fp8).any(dim=1)
    checks = torch.stack([torch.isfinite(case.weights).all(), ~bad_scale.any(), ~bad_key.any()]).tolist()
    require(checks[0], "weights", case.weights[~torch.isfinite(case.weights)][:4].tolist(), "finite weights")
    require(checks[1], "k_scale", case.k_scale[bad_scale][:4].tolist(), "positive finite scales for every key a "
                                                                        "window holds")
    require(checks[2], "k", torch.nonzero(bad_key).flatten()[:4].tolist(), "no NaN key byte in a key a window holds")


def _read_archive(path: Path, extra: tuple[str, ...] = ()) -> tuple[RaggedMeta, dict[str, np.ndarray]]:
    """(meta, arrays, with the optional members `extra` it holds) of a ragged case archive, checked as a paged one
    is (difftest.core.case_archive.check_archive) before any array is decompressed; SpecError naming the path
    when it is not one."""
    meta, headers = check_archive(path, _MEMBERS, _meta, "a ragged case archive as RaggedCase.save writes it",
                                  first="q")
    rows, keys = meta.rows, meta.keys
    shapes = {"q": (rows, meta.H, meta.D), "k": (keys, meta.D), "k_scale": (keys,), "weights": (rows, meta.H),
              "k_start": (rows,), "k_end": (rows,), "expected": (rows, keys), TOPK_K_MEMBER: ()}
    check_shapes(headers, shapes, _MEMBERS, one_line(str(path)))
    return meta, read_arrays(path, (*_ARRAYS, *(member for member in extra if member in headers)))


def _meta(archive: zipfile.ZipFile, headers: dict[str, MemberHeader], where: str) -> RaggedMeta:
    """The meta, its size bounded by the rows `q` declares (a spec may list a window per row)."""
    q = headers["q"]
    if len(q.shape) != 3:
        raise SpecError(f"{where} q.shape", q.shape, _MEMBERS["q"].words)
    return read_meta(archive, headers, RaggedMeta, META_FIXED_CHARS + 2 * META_CHARS_PER_REQUEST * q.shape[0], where)


def load_member(path: str | Path, member: str) -> np.ndarray | None:
    """The optional member `member` of a ragged case archive (TOPK_K_MEMBER), read through the archive's checks
    (its dtype and shape those _MEMBERS gives it); None where the archive has none."""
    return _read_archive(Path(path), (member,))[1].get(member)


# --------------------------------------------------------------------------- contract

@dataclasses.dataclass(frozen=True)
class RaggedTiles:
    """What a kernel's tiling is known to be: the planner derives its edge cases from these facts."""

    kv: tuple[int, ...] = ()  # keys per tile (DeepGEMM sm90: 64 per math warpgroup, 256 per block)
    q_rows: int | None = None  # query rows per q block, where fixed
    q_head_rows: int | None = None  # rows x heads per q block, where that is fixed: BLOCK_Q = q_head_rows // H
    start_align: int = 1  # a q block reads keys from its least k_start rounded down to a multiple of this

    def block_q(self, heads: int) -> int | None:
        """Query rows per q block at `heads` heads; None when unknown."""
        if self.q_rows is not None:
            return self.q_rows
        return max(1, self.q_head_rows // heads) if self.q_head_rows is not None else None


@dataclasses.dataclass(frozen=True)
class RaggedContract:
    """A ragged logits kernel's declared conventions and envelope. `None` in an envelope field means any value.

    `mask` is what it promises outside each window: TAIL_NEG_INF, -inf in every column that holds no key of
    the window (columns before k_start and from k_end on under ABSOLUTE, from k_end - k_start on under
    WINDOW_RELATIVE); TAIL_UNSPECIFIED, anything there (DeepGEMM 2.8 leaves its tail unwritten, SGLang's torch
    reference writes 0.0). A WINDOW_RELATIVE row holds max_seqlen_k columns, so a window longer than the
    case's max_seqlen_k is outside the contract (window_reason): no right answer fits it, and DeepGEMM 2.8
    stores past its row unchecked."""

    operation: ClassVar[OperationKind] = OperationKind.RAGGED_LOGITS  # the operation a backend of this contract is
    form: LogitsForm
    mask: MaskConvention
    fp8: Fp8Flavour = Fp8Flavour.E4M3FN
    output_dtype: torch.dtype = torch.float32
    rtol: float = 1e-3  # allowed error, relative to the row's largest |expected| in its window
    devices: tuple[str, ...] = ("cpu", "cuda")
    archs: tuple[str, ...] | None = None  # e.g. ("sm90",): GPU archs accepted
    heads: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    powers_of_two: bool = False  # H and D each one tl.arange block
    max_rows: int | None = None
    max_keys: int | None = None
    tiles: RaggedTiles = RaggedTiles()
    writes_into_output: bool = False  # the backend fills a buffer the engine allocates (poisoned)
    library: str = ""  # distribution name and version actually loaded (and where from), for the report

    def width(self, case: RaggedCase) -> int:
        """Columns of a row of this kernel's output on `case`: keys (ABSOLUTE) or max_seqlen_k (WINDOW_RELATIVE)."""
        return case.keys if self.form == LogitsForm.ABSOLUTE else case.seqlen_k

    def accepts(self, case: RaggedCase, device: str) -> str | None:
        """Why this contract does not take `case` on `device`, or None when it does."""
        if device not in self.devices:
            return f"contract devices {list(self.devices)} exclude {device}"
        if self.archs is not None and device == "cuda" and hardware.arch() not in self.archs:
            return f"contract archs {list(self.archs)} exclude {hardware.arch()}"
        return self.shape_reason(case.rows, case.keys, case.heads, case.head_dim) or self.window_reason(case)

    def shape_reason(self, rows: int, keys: int, heads: int, head_dim: int) -> str | None:
        """Why this contract does not take a case of these dimensions, or None when it does."""
        for field, value, allowed in (("heads", heads, self.heads), ("head_dim", head_dim, self.head_dims)):
            if allowed is not None and value not in allowed:
                return f"contract {field} {list(allowed)} excludes {value}"
        if self.powers_of_two and (heads & (heads - 1) or head_dim & (head_dim - 1)):
            return f"heads={heads} and head_dim={head_dim} are not both powers of two"
        for field, value, most in (("rows", rows, self.max_rows), ("keys", keys, self.max_keys)):
            if most is not None and value > most:
                return f"{field}={value} exceeds the contract's max_{field} {most}"
        return None

    def window_reason(self, case: RaggedCase) -> str | None:
        """Why the case's windows do not fit this kernel's output form, or None when they do."""
        if self.form == LogitsForm.WINDOW_RELATIVE and case.longest > case.seqlen_k:
            return (f"a window of {case.longest} keys is longer than max_seqlen_k = {case.seqlen_k}: a window-relative "
                    f"row holds max_seqlen_k columns")
        return None


# --------------------------------------------------------------------------- what a kernel is handed

@dataclasses.dataclass(frozen=True)
class RaggedInputs:
    """Exactly what a ragged logits kernel is handed: fp8 tensors in its flavour, int32 windows (every kernel
    of the field takes them so), and max_seqlen_k where its form needs one (None under ABSOLUTE)."""

    q: torch.Tensor  # fp8 [rows, H, D]
    k: torch.Tensor  # fp8 [keys, D]
    k_scale: torch.Tensor  # float32 [keys]
    weights: torch.Tensor  # float32 [rows, H]
    k_start: torch.Tensor  # int32 [rows]
    k_end: torch.Tensor  # int32 [rows]
    form: LogitsForm
    fp8: Fp8Flavour
    max_seqlen_k: int | None = None  # WINDOW_RELATIVE: the output's width, at least every window's length

    @property
    def rows(self) -> int:
        return self.q.shape[0]

    @property
    def keys(self) -> int:
        return self.k.shape[0]

    @property
    def width(self) -> int:
        """Columns of an output row in this form."""
        return self.keys if self.max_seqlen_k is None else self.max_seqlen_k


def encode_ragged(case: RaggedCase, contract: RaggedContract) -> RaggedInputs:
    """The inputs a kernel of `contract` reads; SpecError when its output form cannot hold the case's windows."""
    reason = contract.window_reason(case)
    if reason:
        raise SpecError("k_end", case.describe(), f"windows a {contract.form.value} kernel can hold: {reason}")
    i32 = torch.int32
    q = convert(case.q, case.fp8, contract.fp8, "q").view(contract.fp8.dtype)
    k = convert(case.k, case.fp8, contract.fp8, "k").view(contract.fp8.dtype)
    width = case.seqlen_k if contract.form == LogitsForm.WINDOW_RELATIVE else None
    return RaggedInputs(q=q.contiguous(), k=k.contiguous(), k_scale=case.k_scale.contiguous(),
                        weights=case.weights.contiguous(), k_start=case.k_start.to(i32).contiguous(),
                        k_end=case.k_end.to(i32).contiguous(), form=contract.form, fp8=contract.fp8,
                        max_seqlen_k=width)
