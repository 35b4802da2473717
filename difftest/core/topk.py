"""The top-k stage of the indexer: its canonical problem (TopkCase), what a kernel declares (TopkContract)
and what a kernel is handed (TopkInputs), the siblings of Case, Contract and KernelInputs for paged logits.

A TopkCase is float32 logits rows, one window [start, end) per row and k. The logits are held as the
memory a kernel reads: `storage` [rows, row_stride] with the row's `width` columns first, so a strided
view (DeepGEMM's row-padded logits, a row stride that is not a multiple of 4) is a case like any
other, and a contiguous one has row_stride == width. The columns past `width` of each storage row are
stride padding: no column of any row; the generators fill them with values larger than every logit,
so a kernel that walks rows at the wrong stride picks them up. How windows reach a kernel (row_starts
and row_ends, lengths, or the decode rule end = L - next_n + j + 1) is the contract's WindowForm; the
case holds the windows themselves (docs/reference/topk.md).
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

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
from difftest.core.kinds import IndexConvention, NanRanking, OperationKind, RowStride, TopkPadding, WindowForm
from difftest.core.schema import MAX_NAME, MAX_NEXT_N, Int, Member, Rule, Seed, Text, one_line

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_WIDTH = 1 << 24  # columns of a row: 16x the 2^20-column rows of the widest family
MAX_ROWS = 1 << 20  # rows of a case
# The members of a top-k case archive; golden files add the `expected_*` ones (tests/golden/topk).
_ARRAYS = ("storage", "starts", "ends")
_COUNT = MemberRule(("<i8",), "[rows] int64 (a golden file's counts)", optional=True)
_MEMBERS = {"storage": MemberRule(("<f4",), "[rows, row_stride] float32"),
            "starts": MemberRule(("<i8",), "[rows] int64"), "ends": MemberRule(("<i8",), "[rows] int64"),
            META_MEMBER: MemberRule((), "a JSON string"),
            "expected_kth": MemberRule(("<f8",), "[rows] float64 (a golden file's k-th values)", optional=True),
            "expected_above": _COUNT, "expected_equal": _COUNT, "expected_candidates": _COUNT, "expected_nans": _COUNT}


def decode_ends(seq_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """[B * next_n] int64 window ends of the decode rule: row b*next_n + j ends at max(L_b - next_n + j + 1, 0)."""
    offsets = torch.arange(next_n, device=seq_lens.device) - next_n + 1
    return (seq_lens.to(torch.int64)[:, None] + offsets).clamp(min=0).flatten()


@dataclasses.dataclass(frozen=True, repr=False)
class TopkCase:
    """One top-k problem: the k largest logits of each row inside its window [start, end)."""

    name: str
    storage: torch.Tensor  # float32 [rows, row_stride]: the rows as laid out in memory
    width: int  # columns of a row: the logits are storage[:, :width]
    starts: torch.Tensor  # int64 [rows]: first column of each row's window
    ends: torch.Tensor  # int64 [rows]: one past its last column
    k: int
    next_n: int = 1  # rows per request: consecutive groups of next_n rows are one request's draft rows
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.storage.shape[0]

    @property
    def row_stride(self) -> int:
        return self.storage.shape[1]

    @property
    def logits(self) -> torch.Tensor:
        """float32 [rows, width], a view of `storage` with stride(0) == row_stride."""
        return self.storage[:, :self.width]

    @property
    def device(self) -> torch.device:
        return self.storage.device

    def window_lens(self) -> torch.Tensor:
        """int64 [rows]: end - start of each row."""
        return self.ends - self.starts

    def to(self, device: str | torch.device) -> TopkCase:
        """The same case with every tensor on `device` (this case where they all are already)."""
        if self.storage.device == torch.device(device):
            return self
        return dataclasses.replace(self, storage=self.storage.to(device), starts=self.starts.to(device),
                                   ends=self.ends.to(device))

    def __repr__(self) -> str:
        # pytest prints fixture values of a failing test: a line, not megabytes of logits.
        return f"TopkCase({self.name!r}, {self.describe()})"

    def describe(self) -> str:
        """One line: the structure a kernel engineer reads first."""
        windows = list(zip(self.starts.tolist()[:6], self.ends.tolist()[:6], strict=True))
        shown = [f"[{s},{e})" for s, e in windows] + (["..."] if self.rows > 6 else [])
        stride = "" if self.row_stride == self.width else f" row_stride={self.row_stride}"
        mtp = "" if self.next_n == 1 else f" next_n={self.next_n}"
        return f"rows={self.rows} width={self.width}{stride} k={self.k}{mtp} windows={' '.join(shown)}"

    def validate(self) -> TopkCase:
        """Check every field against the others; SpecError names the first one that is impossible."""
        require(isinstance(self.name, str), "name", self.name, "a str")
        for field in ("storage", "starts", "ends"):
            value = getattr(self, field)
            require(isinstance(value, torch.Tensor), field, type(value).__name__, "a torch.Tensor")
        require(self.storage.dim() == 2, "storage.shape", tuple(self.storage.shape), "[rows, row_stride]")
        require(self.storage.dtype == torch.float32, "storage.dtype", self.storage.dtype, "torch.float32")
        require(self.storage.stride(1) == 1 and self.storage.stride(0) == self.row_stride, "storage.stride",
                self.storage.stride(), f"a contiguous [rows, row_stride] tensor ({(self.row_stride, 1)})")
        require(_is_int(self.width) and 1 <= self.width <= self.row_stride, "width", self.width,
                f"an integer in [1, row_stride = {self.row_stride}]")
        require(_is_int(self.k) and self.k >= 1, "k", self.k, "an integer >= 1")
        require(_is_int(self.next_n) and self.next_n >= 1 and self.rows % self.next_n == 0, "next_n", self.next_n,
                f"an integer >= 1 dividing rows = {self.rows}")
        for field in ("starts", "ends"):
            value = getattr(self, field)
            require(value.dtype == torch.int64, f"{field}.dtype", value.dtype, "torch.int64")
            require(tuple(value.shape) == (self.rows,), f"{field}.shape", tuple(value.shape),
                    f"[rows] = ({self.rows},)")
            require(value.device == self.device, f"{field}.device", str(value.device), f"storage's, {self.device}")
        ok = torch.stack([(self.starts >= 0).all(), (self.starts <= self.ends).all(), (self.ends <= self.width).all()])
        require(all(ok.tolist()), "starts, ends", _shown(list(zip(self.starts.tolist(), self.ends.tolist(),
                                                                    strict=True))),
                f"0 <= start <= end <= width = {self.width} in every row")
        return self

    def save(self, path: str | Path) -> Path:
        """Write the case as an .npz: storage, starts, ends and its meta (TopkMeta: what self.meta holds, then
        name, rows, row_stride, width, k and next_n); SpecError naming a meta key TopkMeta has no field for."""
        path = Path(path)
        meta = TopkMeta.from_json({**self.meta, "name": self.name, "rows": self.rows, "row_stride": self.row_stride,
                                   "width": self.width, "k": self.k, "next_n": self.next_n}, "meta.")
        case = self.to("cpu")
        np.savez_compressed(path, storage=case.storage.numpy(), starts=case.starts.numpy(), ends=case.ends.numpy(),
                            meta=np.array(json.dumps(meta.to_json())))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TopkCase:
        """Read a case written by save() (or a golden file of tests/golden/topk). Members are checked
        against the meta's sizes before any is decompressed; a file that does not fit is a SpecError
        naming the path and what is wrong, never another exception."""
        meta, arrays = _read_archive(Path(path))
        case = cls(name=meta.name, storage=torch.from_numpy(arrays["storage"]), width=meta.width,
                   starts=torch.from_numpy(arrays["starts"]), ends=torch.from_numpy(arrays["ends"]),
                   k=meta.k, next_n=meta.next_n, meta=meta.case_meta)
        return case.validate()


SpecJson = Rule(lambda v: type(v) is dict,
                "a JSON object: the spec the case was drawn from (TopkSpec.to_json)").type(dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TopkMeta(ArchiveMeta):
    """The `meta` of a top-k case archive, its one definition: what TopkCase.meta held (a drawn case's seed and
    spec, a golden file's NaN ranking), then the structure of its arrays. TopkCase.save writes it (to_json:
    the fields TopkCase.meta does not hold are left out), TopkCase.load reads it."""

    what = "a JSON object of top-k case meta fields"
    seed: Seed | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    spec: SpecJson | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    # how a golden file's truth ranks NaN
    nan: Member(NanRanking) | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    name: Text(MAX_NAME)
    rows: Int(0, MAX_ROWS)
    row_stride: Int(1, MAX_WIDTH)
    width: Int(1, MAX_WIDTH)
    k: Int(1, MAX_WIDTH)
    next_n: Int(1, MAX_NEXT_N)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(values: list[Any]) -> str:
    return repr(values if len(values) <= 8 else [*values[:8], "..."])


def _read_archive(path: Path) -> tuple[TopkMeta, dict[str, np.ndarray]]:
    """(meta, arrays) of a top-k case archive, checked as a paged one is (difftest.core.case_archive.check_archive)
    before any array is decompressed; SpecError naming the path when it is not one."""
    meta, headers = check_archive(path, _MEMBERS, _meta, "a top-k case archive as TopkCase.save writes it",
                                  first="storage")
    rows = meta.rows
    check_shapes(headers, {"storage": (rows, meta.row_stride), "starts": (rows,), "ends": (rows,),
                           **{member: (rows,) for member in _MEMBERS if member.startswith("expected_")}},
                 _MEMBERS, one_line(str(path)))
    return meta, read_arrays(path, _ARRAYS)


def _meta(archive: zipfile.ZipFile, headers: dict[str, MemberHeader], where: str) -> TopkMeta:
    """The meta, its size bounded by the rows `storage` declares (a spec may list a window per row)."""
    storage = headers["storage"]
    if len(storage.shape) != 2:
        raise SpecError(f"{where} storage.shape", storage.shape, _MEMBERS["storage"].words)
    return read_meta(archive, headers, TopkMeta, META_FIXED_CHARS + 2 * META_CHARS_PER_REQUEST * storage.shape[0],
                     where)


# --------------------------------------------------------------------------- contract

@dataclasses.dataclass(frozen=True)
class TopkContract:
    """A top-k kernel's declared conventions and envelope. `None` in an envelope field means any value.
    No tolerance: a top-k is right or wrong (ties aside, which the oracle honours)."""

    operation: ClassVar[OperationKind] = OperationKind.TOPK  # the operation a backend of this contract is
    index: IndexConvention
    padding: TopkPadding
    window: WindowForm
    ks: tuple[int, ...] | None = None  # the k values it takes; None: any k >= 1 (up to max_k)
    max_k: int | None = None
    max_width: int | None = None
    max_rows: int | None = None
    width_at_least_k: bool = False  # it ranks whole rows with torch.topk(row, k): width >= k
    sorted: bool = False  # promises each row's indices in descending order of value, padding last
    nan: NanRanking = NanRanking.UNDEFINED
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    row_stride: RowStride = RowStride.ANY
    next_n: tuple[int, ...] | None = None  # under the decode rule: the next_n values it takes
    mutates_logits: bool = False  # writes into the logits it is handed: the engine hands it a copy
    devices: tuple[str, ...] = ("cpu", "cuda")
    archs: tuple[str, ...] | None = None  # e.g. ("sm90",): GPU archs accepted
    library: str = ""  # distribution name and version actually loaded (and where from), for the report

    def accepts(self, case: TopkCase, device: str) -> str | None:
        """Why this contract does not take `case` on `device`, or None when it does."""
        if device not in self.devices:
            return f"contract devices {list(self.devices)} exclude {device}"
        if self.archs is not None and device == "cuda" and hardware.arch() not in self.archs:
            return f"contract archs {list(self.archs)} exclude {hardware.arch()}"
        return (self.shape_reason(case.rows, case.width, case.row_stride, case.k)
                or self.window_reason(case))

    def shape_reason(self, rows: int, width: int, row_stride: int, k: int) -> str | None:
        """Why this contract does not take logits of these dimensions and this k, or None when it does."""
        if torch.float32 not in self.dtypes:
            return f"contract dtypes {list(self.dtypes)} exclude the cases' torch.float32"
        if self.ks is not None and k not in self.ks:
            return f"contract ks {list(self.ks)} exclude k={k}"
        checks = (("k", k, self.max_k), ("width", width, self.max_width), ("rows", rows, self.max_rows))
        for field, value, most in checks:
            if most is not None and value > most:
                return f"{field}={value} exceeds the contract's max_{field} {most}"
        if self.width_at_least_k and width < k:
            return f"width={width} is narrower than k={k} (the kernel ranks whole rows with topk(k))"
        return self._stride_reason(width, row_stride)

    def _stride_reason(self, width: int, row_stride: int) -> str | None:
        if self.row_stride == RowStride.MULTIPLE_OF_4 and row_stride % 4:
            return f"row stride {row_stride} is not a multiple of 4 (the contract's row_stride requirement)"
        if self.row_stride == RowStride.EQUALS_WIDTH and row_stride != width:
            return f"row stride {row_stride} differs from width {width} (the contract assumes contiguous rows)"
        return None

    def window_reason(self, case: TopkCase) -> str | None:
        """Why the case's windows cannot be told to this kernel in its WindowForm, or None when they can."""
        if self.window in (WindowForm.STARTS_ENDS, WindowForm.STARTS_LENGTHS):
            return None
        if bool((case.starts != 0).any()):
            return f"a window starts past column 0 and the contract's window form {self.window.value} has no starts"
        if self.window == WindowForm.LENGTHS:
            return None
        if self.next_n is not None and case.next_n not in self.next_n:
            return f"contract next_n {list(self.next_n)} exclude {case.next_n}"
        if decode_seq_lens(case) is None:
            return f"the windows do not follow the decode rule end = L - next_n + j + 1 at next_n={case.next_n}"
        return None


def decode_seq_lens(case: TopkCase) -> torch.Tensor | None:
    """[B] int64 L_b whose decode rule gives exactly the case's windows (every start 0, row b*next_n + j
    ending at max(L_b - next_n + j + 1, 0)), or None when no such lengths exist."""
    last = case.ends.reshape(-1, case.next_n)[:, -1]  # the last draft row sees all L_b keys
    fits = torch.equal(decode_ends(last, case.next_n), case.ends) and not bool((case.starts != 0).any())
    return last if fits else None


# --------------------------------------------------------------------------- what a kernel is handed

@dataclasses.dataclass(frozen=True)
class TopkInputs:
    """Exactly what a top-k kernel is handed, its windows in the contract's form (int32, as every kernel
    of the field takes them); the fields another form uses are None."""

    logits: torch.Tensor  # float32 [rows, width], stride(0) = the case's row stride
    k: int
    form: WindowForm
    row_starts: torch.Tensor | None = None  # [rows] (STARTS_ENDS, STARTS_LENGTHS)
    row_ends: torch.Tensor | None = None  # [rows] (STARTS_ENDS)
    lengths: torch.Tensor | None = None  # [rows] (STARTS_LENGTHS, LENGTHS)
    seq_lens: torch.Tensor | None = None  # [B] (DECODE_RULE)
    next_n: int = 1  # rows per request (DECODE_RULE)

    @property
    def rows(self) -> int:
        return self.logits.shape[0]

    def windows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(starts, ends) int64 [rows] of whichever form the inputs are in: encode_topk's inverse."""
        if self.form == WindowForm.DECODE_RULE:
            assert self.seq_lens is not None
            ends = decode_ends(self.seq_lens, self.next_n)
            return torch.zeros_like(ends), ends
        starts = self.row_starts.to(torch.int64) if self.row_starts is not None else None
        if self.form == WindowForm.STARTS_ENDS:
            assert starts is not None and self.row_ends is not None
            return starts, self.row_ends.to(torch.int64)
        assert self.lengths is not None
        lengths = self.lengths.to(torch.int64)
        starts = torch.zeros_like(lengths) if starts is None else starts
        return starts, starts + lengths


def encode_topk(case: TopkCase, contract: TopkContract) -> TopkInputs:
    """The inputs a kernel of `contract` reads; SpecError when its window form cannot say the case's windows.
    A kernel that writes into its logits gets a copy of the storage (same strides)."""
    reason = contract.window_reason(case)
    if reason:
        raise SpecError("windows", case.describe(), f"windows the contract's {contract.window.value} form can say: "
                                                    f"{reason}")
    storage = case.storage.clone() if contract.mutates_logits else case.storage
    logits, i32 = storage[:, :case.width], torch.int32
    encoders: dict[WindowForm, Callable[[], dict[str, Any]]] = {
        WindowForm.STARTS_ENDS: lambda: dict(row_starts=case.starts.to(i32), row_ends=case.ends.to(i32)),
        WindowForm.STARTS_LENGTHS: lambda: dict(row_starts=case.starts.to(i32), lengths=case.window_lens().to(i32)),
        WindowForm.LENGTHS: lambda: dict(lengths=case.ends.to(i32)),
        WindowForm.DECODE_RULE: lambda: dict(seq_lens=_decode_lens(case).to(i32), next_n=case.next_n),
    }
    return TopkInputs(logits=logits, k=case.k, form=contract.window, **encoders[contract.window]())


def _decode_lens(case: TopkCase) -> torch.Tensor:
    lens = decode_seq_lens(case)
    assert lens is not None  # window_reason checked it
    return lens
