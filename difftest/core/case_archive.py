"""A case archive (.npz, a zip of .npy files, as difftest.core.case.Case.save writes it), checked from its
zip directory and the .npy headers alone before anything is decompressed, and its meta (CaseMeta, the
meta's one definition: Case.save writes it, the check reads it). The top-k and ragged case archives
(difftest.core.topk, difftest.core.ragged) are checked by the same steps (check_archive), with members and
shapes of their own.

check_case_archive reads the members, their dtypes and shapes against the case's meta, each member's
declared size against what those shapes take, and their sizes together against the host's free
memory, before any array is decompressed. zipfile never inflates a member past its declared size, so
nothing larger than the meta implies is ever decompressed, and object arrays (pickles) are refused.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from difftest.core.errors import SpecError
from difftest.core.hardware import available_memory
from difftest.core.kinds import CacheLayout, Fp8Flavour
from difftest.core.schema import (
    MAX_BATCH,
    MAX_BLOCK_SIZE,
    MAX_EXTRA_COLUMNS,
    MAX_HEADS,
    MAX_LOGITS,
    MAX_MODEL_LEN,
    MAX_NAME,
    MAX_NEXT_N,
    MAX_POOL_BYTES,
    MAX_QUERY_BYTES,
    Checked,
    HeadDim,
    Int,
    IntList,
    Member,
    Name,
    Names,
    Record,
    Seed,
    TableOf,
    Text,
    bound_text,
    one_line,
    parse_json,
    shown,
    validate,
)
from difftest.core.spec import CaseSpec, within

MAX_NPY_HEADER = 1 << 16  # an .npy header (numpy writes ~128 bytes)
MAX_DEFLATE_RATIO = 1032  # deflate's largest expansion: a member cannot inflate to more than this many times its size
LOAD_FACTOR = 3  # host memory a case archive's arrays take while Case.load reads them, per declared byte
META_FIXED_CHARS = 1 << 16  # the JSON meta of a case, less its per-request lists
META_CHARS_PER_REQUEST = 24  # seq_lens and spec.lengths: up to 7 digits and ', ' each, with room


# The metadata of a field of an archive's meta that its case keeps in its `meta` dict (a drawn case's seed
# and spec): such a field defaults to None, and is left out of the JSON where the case's meta has none.
IN_CASE_META = {"in_case_meta": True}
Reaches = TableOf(Name, Names, "a JSON object of backend names and the families each one reaches")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArchiveMeta(Record):
    """The base of a case archive's meta (a paged, top-k or ragged case's): the fields made with
    IN_CASE_META are what the case keeps in its `meta` dict, the others the case's own structure."""

    def dumped(self, out: dict[str, Any]) -> dict[str, Any]:
        """The meta as the case's save writes it: the case's meta fields only where it has them."""
        kept = self.case_meta_fields()
        return {key: value for key, value in out.items() if value is not None or key not in kept}

    @property
    def case_meta(self) -> dict[str, Any]:
        """What the case's `meta` dict holds of it: its IN_CASE_META fields the archive gives."""
        kept = self.case_meta_fields()
        return {key: value for key, value in self.to_json().items() if key in kept}

    @classmethod
    def case_meta_fields(cls) -> frozenset[str]:
        """The names of its IN_CASE_META fields."""
        return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("in_case_meta"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaseMeta(ArchiveMeta):
    """The `meta` of a case archive: what Case.meta held (a drawn case's seed and spec, its edge families, a
    golden file's note), then the structure its arrays must have. Case.save writes it (to_json: the fields
    Case.meta does not hold are left out) and check_case_archive reads it."""

    what = "a JSON object of case meta fields"
    seed: Seed | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    spec: Checked(CaseSpec) | None = dataclasses.field(default=None, metadata=IN_CASE_META)  # CaseSpec.to_json's
    families: Names | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    # the families each backend's own plan claims of it (difftest.engine.plan.PlannedCase.reach)
    reach: Reaches | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    note: Text() | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    # an indexer case's top-k k (difftest.core.indexer)
    topk_k: Int(1, MAX_MODEL_LEN) | None = dataclasses.field(default=None, metadata=IN_CASE_META)
    name: Text(MAX_NAME)
    B: Int(0, 2 * MAX_BATCH)
    next_n: Int(1, MAX_NEXT_N)
    H: Int(1, MAX_HEADS)
    D: HeadDim
    block_size: Int(1, MAX_BLOCK_SIZE)
    max_model_len: Int(1, MAX_MODEL_LEN)
    layout: Member(CacheLayout)
    fp8: Member(Fp8Flavour)
    seq_lens: IntList(0, MAX_MODEL_LEN, 2 * MAX_BATCH, "a list of B lengths in [0, max_model_len]")

    def checked(self) -> None:
        """B lengths within max_model_len; what the arrays allocate, bounded; the structure of the spec the
        case was drawn from, when it names one."""
        if len(self.seq_lens) != self.B:
            raise SpecError("seq_lens", shown(self.seq_lens), f"B = {self.B} lengths")
        within("seq_lens", self.seq_lens, self.max_model_len)
        rows = self.B * self.next_n
        if rows * self.max_model_len > MAX_LOGITS:
            raise SpecError("B", self.B, f"B * next_n * max_model_len at most {bound_text(MAX_LOGITS)}")
        if rows * self.H * self.D > MAX_QUERY_BYTES:
            raise SpecError("B", self.B, f"B * next_n * H * D at most {bound_text(MAX_QUERY_BYTES)}")
        if self.spec is not None:
            self._matches_spec(validate(CaseSpec, self.spec))

    def _matches_spec(self, spec: CaseSpec) -> None:
        """The arrays were drawn from `spec`: their structure is the spec's."""
        pairs = (("next_n", "next_n"), ("H", "heads"), ("D", "head_dim"), ("block_size", "block_size"),
                 ("max_model_len", "max_model_len"), ("fp8", "fp8"))
        for mine, theirs in pairs:
            have, wanted = _plain(getattr(self, mine)), _plain(getattr(spec, theirs))
            if have != wanted:
                raise SpecError(mine, have, f"spec.{theirs} = {wanted!r}, the spec the case was drawn from")
        if self.B != spec.total_batch:
            raise SpecError("B", self.B, f"{spec.total_batch}: the spec's requests and padding")
        if spec.lengths is not None and tuple(self.seq_lens[:len(spec.lengths)]) != spec.lengths:
            raise SpecError("seq_lens", shown(self.seq_lens), "the spec's lengths, then its padding")


def _plain(value: Any) -> Any:
    """An enum's value (an fp8 flavour as the JSON names it), anything else as it is."""
    return getattr(value, "value", value)


@dataclasses.dataclass(frozen=True)
class MemberRule:
    """What one member of a case archive may be: its dtypes (numpy's dtype.str), its shape in words, and
    whether an archive may leave it out (a golden file's expected values)."""

    dtypes: tuple[str, ...]
    words: str
    optional: bool = False


META_MEMBER = "meta"
# The members of a paged case archive.
_MEMBERS = {
    "q": MemberRule(("|u1",), "[B, next_n, H, D] uint8"),
    "kv_cache": MemberRule(("|u1",), "[num_blocks, block_size, 1, D + 4] uint8"),
    "weights": MemberRule(("<f4",), "[B * next_n, H] float32"),
    "context_lens": MemberRule(("<i4", "<i8"), "[B, next_n] int32"),
    "block_table": MemberRule(("<i4", "<i8"), "[B, W] int32 or int64"),
    META_MEMBER: MemberRule((), "a JSON string"),
    "expected": MemberRule(("<f4", "<f8"), "[B * next_n, max_model_len] float32 or float64 (a golden file's logits)",
                           optional=True),
}
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, OSError,
                   ValueError, KeyError, IndexError, struct.error, zlib.error, OverflowError, TypeError)


class MemberHeader:
    """One member of an archive as its zip entry and .npy header declare it: what reading it would allocate."""

    def __init__(self, info: zipfile.ZipInfo, shape: tuple[int, ...], dtype: np.dtype, offset: int) -> None:
        self.info, self.shape, self.dtype, self.offset = info, shape, dtype, offset

    @property
    def nbytes(self) -> int:
        """The bytes of its array."""
        return math.prod(self.shape) * self.dtype.itemsize


def check_case_archive(path: str | Path, where: str | None = None) -> CaseMeta:
    """Check a case archive without decompressing its arrays; its meta.

    The zip must hold exactly the members Case.save writes (q, kv_cache, weights, context_lens,
    block_table, meta; a golden file's `expected` too), as .npy files of format 1.0 or 2.0, stored or
    deflated, not encrypted, no object arrays. Each member's shape and dtype (read from its header)
    must be what the meta says, and its declared size exactly its header plus its data. The meta is
    the only array read, and only when its declared size fits the number of requests q declares.
    """
    def meta(archive: zipfile.ZipFile, headers: dict[str, MemberHeader], where: str) -> CaseMeta:
        q = headers["q"]
        if len(q.shape) != 4:
            raise SpecError(f"{where} q.shape", q.shape, _MEMBERS["q"].words)
        # the meta holds a list of lengths: its size is bounded by the number of requests q declares
        return read_meta(archive, headers, CaseMeta, META_FIXED_CHARS + META_CHARS_PER_REQUEST * q.shape[0], where)

    meta_of, headers = check_archive(path, _MEMBERS, meta, "a case archive (.npz) as Case.save writes it", where,
                                     first="q")
    _check_arrays(headers, meta_of, one_line(f"{path}" if where is None else where))
    return meta_of


Meta = TypeVar("Meta", bound="ArchiveMeta")


def check_archive(path: str | Path, members: Mapping[str, MemberRule],
                  meta: Callable[[zipfile.ZipFile, dict[str, MemberHeader], str], Meta], what: str,
                  where: str | None = None, first: str = META_MEMBER) -> tuple[Meta, dict[str, MemberHeader]]:
    """(its meta, its members' headers) of a case archive of `members`, checked without decompressing an
    array: each member once and no other, each a plain .npy of one of its dtypes whose declared size is
    its header and its data and what its bytes in the archive can hold, all of them together within this
    host's memory; `meta` reads the meta (its shapes checked by the caller). `first` is read first (it may
    bound the others); SpecError naming the path, `what` it should be, and what is wrong."""
    where = one_line(f"{path}" if where is None else where)
    try:
        with zipfile.ZipFile(path) as archive:
            headers = _headers(archive, members, first, where)
            _fits_memory(headers, where)
            return meta(archive, headers, where), headers
    except SpecError:
        raise
    except _ARCHIVE_ERRORS as exc:
        raise SpecError(where, str(path), f"{what} ({type(exc).__name__}: {one_line(str(exc))[:200]})") from None


def read_arrays(path: str | Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The arrays `names` of an archive check_archive passed, copied out of it; SpecError naming the path
    where one is torn after its header, never another exception."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name].copy() for name in names}
    except (*_ARCHIVE_ERRORS, MemoryError) as exc:
        raise SpecError(one_line(str(path)), str(path), f"a case archive whose arrays read back "
                        f"({type(exc).__name__}: {one_line(str(exc))[:200]})") from None


def check_shapes(headers: dict[str, MemberHeader], shapes: Mapping[str, tuple[int, ...]],
                 members: Mapping[str, MemberRule], where: str) -> None:
    """Each member present has the shape `shapes` gives it (what its meta says): SpecError naming the first
    that has not."""
    for member, shape in shapes.items():
        if member in headers and headers[member].shape != shape:
            raise SpecError(f"{where} {member}.shape", headers[member].shape,
                            f"{shape}: {members[member].words}, as the meta says")


def _headers(archive: zipfile.ZipFile, members: Mapping[str, MemberRule], first: str,
             where: str) -> dict[str, MemberHeader]:
    infos = archive.infolist()
    names = [info.filename for info in infos]
    allowed = [f"{m}.npy" for m in members]
    seen = Counter(names)
    odd = sorted(n for n, times in seen.items() if n not in allowed or times > 1)
    if odd:
        raise SpecError(f"{where} members", shown(odd), f"each of {allowed} once at most")
    missing = [m for m, rule in members.items() if f"{m}.npy" not in names and not rule.optional]
    if missing:
        raise SpecError(f"{where} members", shown(sorted(names)), f"{[f'{m}.npy' for m in missing]} as well")
    lead = f"{first}.npy"
    order = [lead] + [n for n in names if n != lead]  # `first` first: it may bound what the others declare
    by_name = {info.filename: info for info in infos}
    headers = {name[:-4]: _header(archive, by_name[name], f"{where} {name}") for name in order}
    for member, header in headers.items():
        dtypes = members[member].dtypes
        if member != META_MEMBER and header.dtype.str not in dtypes:
            raise SpecError(f"{where} {member}.dtype", header.dtype.str, f"{' or '.join(dtypes)}: "
                            f"{members[member].words}")
    return headers


def _header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> MemberHeader:
    if info.flag_bits & 0x1:
        raise SpecError(where, "encrypted", "an unencrypted member")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise SpecError(f"{where} compression", info.compress_type, "stored (0) or deflated (8)")
    # What a member declares is what numpy allocates: it must be a size its bytes on disk can give.
    most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
        info.compress_size * MAX_DEFLATE_RATIO + 1024
    if info.file_size > most:
        raise SpecError(f"{where} size", info.file_size, f"at most {most} bytes: what its {info.compress_size} "
                        "bytes in the archive can hold")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member, max_header_size=MAX_NPY_HEADER)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member, max_header_size=MAX_NPY_HEADER)
        else:
            raise SpecError(f"{where} version", version, "an .npy of format 1.0 or 2.0")
        offset = member.tell()
    if dtype.hasobject:
        raise SpecError(f"{where} dtype", str(dtype), "plain numbers or text (object arrays are pickles)")
    header = MemberHeader(info, tuple(shape), dtype, offset)
    if info.file_size != offset + header.nbytes:
        raise SpecError(f"{where} size", info.file_size, f"{offset + header.nbytes} bytes: its header and "
                        f"{bound_text(header.nbytes)} bytes of {dtype.str} {tuple(shape)}")
    return header


def _fits_memory(headers: dict[str, MemberHeader], where: str) -> None:
    """The arrays, as declared, must fit this host's free memory LOAD_FACTOR times over: an archive of a
    few megabytes can declare gigabytes of zeros, which would be inflated for many seconds before the
    process is killed for memory, where a case this host cannot hold is an error at once."""
    free = available_memory("cpu")
    declared = sum(header.nbytes for header in headers.values())
    if free is not None and declared * LOAD_FACTOR > free:
        raise SpecError(f"{where} size", declared, "arrays this host can load: at most "
                        f"{bound_text(free // LOAD_FACTOR)} bytes, 1/{LOAD_FACTOR} of the {bound_text(free)} bytes "
                        "this process can still allocate (loading holds each array twice while it is read, and the "
                        "cache once more while it is split)")


def read_meta(archive: zipfile.ZipFile, headers: dict[str, MemberHeader], kind: type[Meta], most: int,
              where: str) -> Meta:
    """The archive's meta member (a 0-d unicode array of JSON text, at most `most` characters) as `kind`."""
    meta = headers[META_MEMBER]
    if meta.dtype.kind != "U" or meta.shape != ():
        raise SpecError(f"{where} meta.npy dtype", f"{meta.dtype.str} {meta.shape}", "a 0-d unicode array (JSON text)")
    chars = meta.dtype.itemsize // 4
    if chars > most:
        raise SpecError(f"{where} meta.npy size", chars, f"at most {most} characters")
    with archive.open(meta.info) as member:
        text = str(np.lib.format.read_array(member, allow_pickle=False))
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise SpecError(f"{where} meta", shown(text), f"JSON ({exc})") from None
    return kind.from_json(data, f"{where} meta.")


def _check_arrays(headers: dict[str, MemberHeader], meta: CaseMeta, where: str) -> None:
    b, n, h, d = meta.B, meta.next_n, meta.H, meta.D
    bs, top = meta.block_size, meta.max_model_len
    longest = max(meta.seq_lens, default=0)
    table = headers["block_table"].shape
    kv = headers["kv_cache"].shape
    shapes: dict[str, tuple[bool, str]] = {
        "q": (headers["q"].shape == (b, n, h, d), f"{(b, n, h, d)}"),
        "weights": (headers["weights"].shape == (b * n, h), f"{(b * n, h)}"),
        "context_lens": (headers["context_lens"].shape == (b, n), f"{(b, n)}"),
        "block_table": (len(table) == 2 and table[0] == b and -(-longest // bs) <= table[1]
                        <= -(-top // bs) + MAX_EXTRA_COLUMNS,
                        f"({b}, W) with {-(-longest // bs)} <= W <= {-(-top // bs) + MAX_EXTRA_COLUMNS}"),
        "kv_cache": (len(kv) == 4 and kv[1:] == (bs, 1, d + 4) and kv[0] * bs * (d + 4) <= MAX_POOL_BYTES,
                     f"(num_blocks, {bs}, 1, {d + 4}) of at most {bound_text(MAX_POOL_BYTES)} bytes"),
        "expected": (headers["expected"].shape == (b * n, top) if "expected" in headers else True,
                     f"{(b * n, top)}"),
    }
    for member, (fits, wanted) in shapes.items():
        if member in headers and not fits:
            raise SpecError(f"{where} {member}.shape", headers[member].shape,
                            f"{wanted}: {_MEMBERS[member].words}, as the meta says")
