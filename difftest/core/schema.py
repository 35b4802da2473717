"""How difftest defines, reads and writes its documents: the rules a field is bounded by, the bounds
every document shares, validation into a document's one definition and back to JSON, and the readers
of files.

Each document is defined once, beside the code that makes it: a dataclass that derives from Record
(a result and everything in it, a spec, bundle.json, a merged matrix entry), each field's type
Annotated with the rule that bounds it (Int, Float, Text, OneOf, ListOf, ...); or, where a document
has no dataclass of its own (run info, a case archive's meta, the matrix and ledger files), a Model.
The stdlib dataclass ignores the annotations at run time; pydantic honours them. From that one
definition come validation (validate: into the dataclass itself), serialisation (to_jsonable: the same
adapter's dump in JSON mode, non-finite floats as 'inf', '-inf' and 'nan') and defaults (the
dataclass's own). docs/architecture.md lists where each document's definition lives.

Every reader validates its document before it builds anything from it: each field typed and bounded,
unknown fields refused, no silent coercion ("3" is not 3, true is not 1). A document that does not fit
is one SpecError naming the first bad field's path ('lengths[2]', '.../bundle.json origin.target',
'resume r.jsonl:3 result.verdict'), its value and what is allowed; the CLI prints it as one line and
exits 2.

This module imports neither torch nor anything of difftest but its errors and text.
"""

import dataclasses
import enum
import functools
import json
import math
import os
import stat
import types
import typing
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    GetPydanticSchema,
    PlainSerializer,
    PlainValidator,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

from difftest.core.errors import SpecError
from difftest.core.text import printable

# --------------------------------------------------------------------------- bounds
#
# A spec, case or result past these is a typo or an attack, not a test: each bound is far above what
# any deployed model or kernel uses, and the products of them a spec checks (difftest.core.spec) keep
# what a case allocates in memory one machine can hold.

# Requests in a case. Loose on purpose: the LOGITS_2_31_ELEMENTS edge family (difftest.generators.envelope)
# draws 2^31 / (next_n * max_model_len) requests, 2^21 at next_n 1 and a 1K context. What the
# requests cost is bounded by MAX_LOGITS, MAX_QUERY_BYTES and MAX_POOL_BYTES.
MAX_BATCH = 1 << 24
MAX_NEXT_N = 16  # MTP draft positions: deployed models use 1..4 (DeepSeek-V3.2's indexer 1 or 2)
MAX_HEADS = 1024  # indexer heads: DeepSeek-V3.2 has 64, the envelopes go to 128
MAX_HEAD_DIM = 1024  # a multiple of 16: the indexer's is 128, the kernels take 32..256
MAX_BLOCK_SIZE = 4096  # tokens per cache block: 1..256 in vLLM and the kernels (DeepGEMM's 64)
# 4M tokens: 32x a deployed 128K context, 16x DeepGEMM's declared 256K, 4x the envelope's CONTEXT_CAP.
MAX_MODEL_LEN = 1 << 22
MAX_EXTRA_COLUMNS = 1 << 16  # block-table columns past the widest sequence's
MAX_CANARY_BLOCKS = 1 << 24
# Bytes of the paged cache, num_blocks * block_size * (head_dim + 4): 1 TiB, 7x an H200's memory; the
# pool-past-2^31-bytes family needs 2^31 and one block.
MAX_POOL_BYTES = 1 << 40
MAX_LOGITS = 1 << 36  # rows * max_model_len: 256 GiB of float32 logits, 32x the logits-past-2^31 family
MAX_QUERY_BYTES = 1 << 36  # fp8 bytes of q: rows * heads * head_dim
MAX_ROWS = MAX_BATCH * 2 * MAX_NEXT_N  # (batch + padding) * next_n
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes
MAX_NAME = 1024  # backend, case, family and spec names; 'package.module:object' targets
MAX_TEXT = 1 << 24  # free text: reasons, notes, sanitizer output, descriptions
MAX_COMMAND = 1 << 28  # a recorded command line: a --spec may list every length
MAX_ITEMS = 1 << 20  # list entries that are not per-row or per-request (names, findings, results)
MAX_DOCUMENT_BYTES = 1 << 32  # a JSON report, stream, bundle.json or ledger read whole


def bound_text(value: int | float) -> str:
    """A bound as people read it: powers of two from 2^16 up as 2^k."""
    if isinstance(value, int) and value >= 1 << 16 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    if isinstance(value, int) and value + 1 >= 1 << 16 and (value + 1) & value == 0:
        return f"2^{value.bit_length()} - 1"
    return str(value)



# --------------------------------------------------------------------------- leaf rules

# A rule's value is written back as the JSON it is (whatever its Python type: a tuple of rows, an enum),
# not checked against the annotation's type on the way out.
AS_GIVEN = GetPydanticSchema(lambda source, handler: {**handler(source),
                                                      "serialization": core_schema.simple_ser_schema("any")})


def _json_float(value: float) -> Any:
    """A float as to_jsonable writes it: non-finite ones as 'inf', '-inf' and 'nan' (JSON has none)."""
    return value if math.isfinite(value) else repr(float(value))


AS_JSON_FLOAT = PlainSerializer(_json_float, when_used="json")  # a float rule's value written back


class Rule:
    """A leaf check, the words for what it allows, and what the value read becomes (`convert`: a JSON
    string into its enum, a list into a tuple); as an annotation, a pydantic validator."""

    def __init__(self, check: Callable[[Any], bool], expected: str,
                 convert: Callable[[Any], Any] | None = None) -> None:
        self.check, self.expected, self.convert = check, expected, convert

    def __call__(self, value: Any) -> Any:
        try:
            fits = bool(self.check(value))
        except (TypeError, ValueError, OverflowError, RecursionError):
            fits = False
        if not fits:
            raise PydanticCustomError("difftest", "{expected}", {"expected": self.expected})
        return value if self.convert is None else self.convert(value)

    def __repr__(self) -> str:
        return f"Rule({self.expected!r})"

    def type(self, python: Any = Any, serializer: Any = AS_GIVEN) -> Any:
        """The annotation that validates with this rule."""
        return Annotated[python, PlainValidator(self), serializer, self]


def _is_int(value: Any) -> bool:
    return type(value) is int


def _in(value: Any, low: float, high: float) -> bool:
    """A JSON number (not a bool) in [low, high]; NaN never is."""
    if type(value) is int:
        return low <= value <= high
    return type(value) is float and low <= value <= high


def Int(low: int, high: int, what: str = "an integer") -> Any:
    words = f"{what} in [{bound_text(low)}, {bound_text(high)}]"
    return Rule(lambda v: _is_int(v) and low <= v <= high, words).type(int)


def Number(low: float = 0.0, high: float = math.inf) -> Any:
    """A finite JSON number in [low, high], kept as given (an int stays an int)."""
    top = "inf)" if high == math.inf else f"{bound_text(high)}]"
    return Rule(lambda v: _in(v, low, high) and (type(v) is int or math.isfinite(v)),
                f"a number in [{bound_text(low)}, {top}").type()


def Float(low: float = 0.0, high: float = math.inf, special: bool = False) -> Any:
    """A record's float: a finite JSON number in [low, high], read as a float; with `special`, also inf
    and NaN as to_jsonable writes them ('inf', '-inf', 'nan') or as JSON's Infinity and NaN."""
    top = "inf)" if high == math.inf else f"{bound_text(high)}]"

    def check(value: Any) -> bool:
        if special and (value in ("inf", "-inf", "nan") or (type(value) is float and not math.isfinite(value))):
            return True
        return _in(value, low, high) and (type(value) is int or math.isfinite(value))

    words = f"a number in [{bound_text(low)}, {top}" + (", or 'inf', '-inf', 'nan'" if special else "")
    return Rule(check, words, float).type(float, AS_JSON_FLOAT)


def Text(high: int = MAX_TEXT, low: int = 0, what: str | None = None) -> Any:
    words = what or (f"a string of at most {bound_text(high)} characters" if low == 0
                     else f"a string of {low} to {bound_text(high)} characters")
    return Rule(lambda v: type(v) is str and low <= len(v) <= high, words).type(str)


def Filled(what: str, high: int = MAX_NAME) -> Any:
    """A string with something besides blanks in it."""
    return Rule(lambda v: type(v) is str and v.strip() != "" and len(v) <= high, what).type(str)


def OneOf(values: Any) -> Any:
    """One of `values` (strings, or an enum's values), kept as the string."""
    allowed = [v.value if hasattr(v, "value") else v for v in values]
    return Rule(lambda v: type(v) is str and v in allowed, f"one of {allowed}").type(str)


def Member(kind: type[enum.Enum]) -> Any:
    """One of the values of the enum `kind`, read as its member."""
    allowed = [member.value for member in kind]
    return Rule(lambda v: type(v) is str and v in allowed, f"one of {allowed}", kind).type(kind)


Bool = Rule(lambda v: type(v) is bool, "true or false").type(bool)
Name = Text(MAX_NAME)
Seed = Int(*SEED_RANGE)
Count = Int(0, (1 << 63) - 1)
RowIndex = Int(0, MAX_ROWS)
JsonFloat = Float(-math.inf, math.inf, special=True)
NonNegative = Float(0.0, math.inf, special=True)


class Expect:
    """What a container field (a list, a table) allows, for the errors pydantic raises on its own."""

    def __init__(self, expected: str) -> None:
        self.expected = expected


def ListOf(item: Any, high: int, what: str, low: int = 0) -> Any:
    return Annotated[list[item], Field(min_length=low, max_length=high), Expect(what)]


def TupleOf(item: Any, high: int, what: str, low: int = 0) -> Any:
    """A JSON list read as a tuple (a record's immutable sequence)."""
    return Annotated[tuple[item, ...], Field(min_length=low, max_length=high), Expect(what)]


def EitherOf(pick: Callable[[Any], str], what: str, **kinds: Any) -> Any:
    """A value validated as the one of `kinds` (Records, by tag) that `pick` names, handed the JSON or the
    instance: its errors are that kind's alone, at its fields' paths."""
    tagged = tuple(Annotated[kind, Tag(tag)] for tag, kind in kinds.items())
    return Annotated[typing.Union[tagged], Discriminator(pick), Expect(what)]  # noqa: UP007  # a tuple of members


def TableOf(key: Any, value: Any, what: str) -> Any:
    return Annotated[dict[key, value], Expect(what)]


HeadDim = Rule(lambda v: _is_int(v) and 16 <= v <= MAX_HEAD_DIM and v % 16 == 0,
               f"a multiple of 16 in [16, {MAX_HEAD_DIM}]").type(int)


def IntList(low: int, high: int, most: int, what: str, least: int = 0, as_tuple: bool = False) -> Any:
    """A list of `least` to `most` integers in [low, high] (read as a tuple with `as_tuple`): checked at C
    speed (a comparison may list millions of rows); a bad entry is named by its index ('lengths[2]')."""
    item = f"an integer in [{bound_text(low)}, {bound_text(high)}]"

    def check(value: Any) -> Any:
        if type(value) is not list or not least <= len(value) <= most:
            raise PydanticCustomError("difftest", "{expected}", {"expected": what})
        if value and not (all(type(v) is int for v in value) and low <= min(value) and max(value) <= high):
            index, bad = next((i, v) for i, v in enumerate(value) if not (_is_int(v) and low <= v <= high))
            raise SpecError(f"[{index}]", shown(bad), item)
        return tuple(value) if as_tuple else value

    return Annotated[tuple[int, ...] if as_tuple else list[int], PlainValidator(check), AS_GIVEN, Expect(what)]


Rows = IntList(0, MAX_ROWS, MAX_ROWS, f"a list of row indices in [0, {bound_text(MAX_ROWS)}]")
Names = ListOf(Name, MAX_ITEMS, f"a list of names of at most {bound_text(MAX_NAME)} characters")


class As:
    """A JSON value checked as `inner` (a Record or a Model: its rules, its checks, its messages) and kept
    as `keep` makes it of the value given and the one validated (default: as given). A result keeps
    the spec dict its case carried, a report its run info."""

    def __init__(self, inner: Any, keep: Callable[[Any, Any], Any] | None = None) -> None:
        self.inner, self.keep = inner, keep

    def __call__(self, value: Any) -> Any:
        made = adapter(self.inner).validate_python(value)  # its errors are the field's, at the field's path
        return value if self.keep is None else self.keep(value, made)


def Checked(inner: Any, python: Any = dict[str, Any], keep: Callable[[Any, Any], Any] | None = None,
            serializer: Any = AS_GIVEN) -> Any:
    """A field kept as `python`, validated as `inner` (see As)."""
    check = As(inner, keep)
    return Annotated[python, PlainValidator(check), serializer, check]


# --------------------------------------------------------------------------- documents

class Model(BaseModel):
    """A JSON object with exactly these fields, each checked strictly: a document that has no dataclass
    of its own."""

    model_config = ConfigDict(extra="forbid", strict=True)
    what: ClassVar[str] = "a JSON object"  # what the object as a whole must be
    unknown_name: ClassVar[str | None] = None  # the word after the object's path naming its unknown keys
    unknown_expected: ClassVar[str | None] = None  # what its keys may be; default: its fields, sorted


R = TypeVar("R", bound="Record")


class Record:
    """The base of a dataclass that is its document's one definition: pydantic validates a JSON object
    into the dataclass itself (from_json; every field Annotated with its rule; unknown keys refused) and
    dumps it back (to_json, to_jsonable). A subclass may set `what` (what the object must be, in errors; default 'a JSON
    object of <class> fields'), override `upgraded` (the JSON as read, before validation: an older
    document's keys as this one names them) and `checked` (the instance, after: checks across fields,
    SpecError naming the field)."""

    __pydantic_config__ = ConfigDict(extra="forbid", ser_json_inf_nan="constants")
    what: ClassVar[str | None] = None
    unknown_name: ClassVar[str | None] = None
    unknown_expected: ClassVar[str | None] = None

    @classmethod
    def upgraded(cls, data: Any) -> Any:
        """`data` (JSON) with an older document's keys as this definition reads them."""
        return data

    def checked(self) -> None:
        """SpecError naming the field where the fields, each valid, do not fit together."""

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        """The record of `data` (JSON as to_json writes it); SpecError naming the first field that does not
        fit, its path after `where` ('result.' reads 'result.verdict')."""
        return validate(cls, data, where)

    def dumped(self, out: dict[str, Any]) -> dict[str, Any]:
        """`out`, this record's fields as JSON, as the document writes them: a subclass may leave fields out
        (those an older document did not have, at the value that means their absence)."""
        return out

    def to_json(self) -> Any:
        """This record as plain JSON (to_jsonable: its adapter's dump, through `dumped`)."""
        return to_jsonable(self)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        """The dataclass's schema, between `upgraded` and `checked` where the class overrides them, and
        dumped through `dumped` where it overrides that (wherever it is: a spec inside another record too)."""
        schema = handler(source)
        # The outermost schema carries the class's reference, so every use of the class goes through both.
        ref = schema.pop("ref", None)
        fields = schema
        if cls.checked is not Record.checked:
            schema = core_schema.no_info_after_validator_function(_checked, schema)
        if cls.upgraded.__func__ is not Record.upgraded.__func__:  # type: ignore[attr-defined]
            schema = core_schema.no_info_before_validator_function(cls.upgraded, schema)
        if cls.dumped is not Record.dumped:
            schema = {**schema, "serialization": core_schema.wrap_serializer_function_ser_schema(
                _dumped, schema=fields)}
        if ref is not None:
            schema["ref"] = ref
        return schema


def _checked(record: Record) -> Record:
    record.checked()
    return record


def _dumped(record: Record, handler: Any) -> Any:
    out = handler(record)
    return record.dumped(out) if isinstance(out, dict) else out


@functools.cache
def adapter(kind: Any) -> TypeAdapter:
    """The one pydantic adapter of a Record or Model class: its validation and its JSON dump."""
    return TypeAdapter(kind)


def to_jsonable(value: Any) -> Any:
    """`value` as plain JSON: a Record as its adapter dumps it in JSON mode; other dataclasses, enums,
    containers and floats (non-finite ones as 'inf', '-inf', 'nan') likewise by hand."""
    if isinstance(value, Record):
        return adapter(type(value)).dump_python(value, mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


# --------------------------------------------------------------------------- validation -> SpecError

M = TypeVar("M")


def validate(model: type[M], data: Any, where: str = "", root: str = "") -> M:
    """`data` as `model` (a Record or a Model); SpecError naming the first field that does not fit.

    Paths follow `where` ('.../bundle.json ' reads '.../bundle.json origin.target'; 'result.' reads
    'result.verdict'); an error about the document as a whole is named `where` without its separator,
    else `root`.
    """
    try:
        return adapter(model).validate_python(data)
    except ValidationError as exc:
        raise spec_error(exc, model, where, root) from None
    except RecursionError:
        raise SpecError(where.rstrip(". ") or root or model.__name__, "...", "a document nested less deeply") from None


def spec_error(exc: ValidationError, model: Any, where: str = "", root: str = "") -> SpecError:
    """The one-line SpecError of the first error of `exc` (unknown fields first, all of one object's together)."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] in UNKNOWN_KEY]
    first = unknown[0] if unknown else errors[0]
    loc = tuple(first["loc"])

    def name(path: str) -> str:
        return one_line(where + path if path else where.rstrip(". ") or root or model.__name__)

    if first["type"] in UNKNOWN_KEY:
        parent = loc[:-1]
        keys = sorted(str(e["loc"][-1]) for e in unknown if tuple(e["loc"][:-1]) == parent)
        path, owner, _ = _walk(model, parent)
        owner = _unwrapped(owner)
        holder = _base(owner)
        field = name(path)
        if getattr(holder, "unknown_name", None):
            field = one_line(f"{where}{path} {holder.unknown_name}" if path else holder.unknown_name)
        expected = getattr(holder, "unknown_expected", None) or f"fields among {sorted(_keys(holder))}"
        return SpecError(field, shown(keys), expected)
    ctx = first.get("ctx") or {}
    if first["type"] == "value_error" and isinstance(ctx.get("error"), SpecError):
        inner: SpecError = ctx["error"]
        path, _, _ = _walk(model, loc)
        joined = path + inner.field if inner.field.startswith("[") else ".".join(p for p in (path, inner.field) if p)
        return SpecError(name(joined), shown(inner.value), inner.expected)
    path, annotation, optional = _walk(model, loc)
    expected = _expected_of(annotation) or ctx.get("expected") or _lower(first["msg"])
    if optional and first["type"] not in MISSING:
        expected += ", or null"
    value = None if first["type"] in MISSING else first.get("input")
    return SpecError(name(path), shown(value), expected)


UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")  # a Model's unknown key, a Record's
MISSING = ("missing", "missing_argument")


def _strip(annotation: Any) -> tuple[Any, bool]:
    """`annotation` without its `| None`, and whether it had one."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _base(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _unwrapped(annotation: Any) -> Any:
    """`annotation`, or the document a Checked field is validated as."""
    marker = next((m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, As)), None)
    return annotation if marker is None else marker.inner


def _is_record(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind) and issubclass(kind, Record)


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


@functools.cache
def record_fields(kind: type) -> dict[str, Any]:
    """A Record's JSON keys (a field's alias where it has one) -> the field's annotation; a field set
    otherwise than from JSON (init=False) is none of them."""
    hints = typing.get_type_hints(kind, include_extras=True)
    out = {}
    for field in (f for f in dataclasses.fields(kind) if f.init):
        annotation = hints[field.name]
        info = next((m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, FieldInfo)), None)
        out[info.alias if info is not None and info.alias else field.name] = annotation
    return out


def _keys(holder: Any) -> list[str]:
    """The JSON keys an object of `holder` may have."""
    if _is_model(holder):
        return [f.alias or n for n, f in holder.model_fields.items()]
    return list(record_fields(holder)) if _is_record(holder) else []


def _field(owner: Any, key: str) -> tuple[bool, Any]:
    """(whether `owner` has the JSON key `key`, that field's annotation)."""
    if _is_model(owner):
        field = next((f for n, f in owner.model_fields.items() if (f.alias or n) == key), None)
        if field is None:
            return False, None
        return True, Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    fields = record_fields(owner)
    return key in fields, fields.get(key)


def _walk(model: Any, loc: tuple[Any, ...]) -> tuple[str, Any, bool]:
    """(the path of `loc` as text, the annotation found there, whether it may be null)."""
    path, annotation = "", model
    steps = list(loc)
    while steps:
        step = steps.pop(0)
        annotation, _ = _strip(annotation)
        annotation = _unwrapped(annotation)
        base = _base(annotation)
        if (_is_model(base) or _is_record(base)) and isinstance(step, str):
            found, annotation = _field(base, step)
            path += f".{step}" if path else step
            if not found:
                return path, None, False
        elif typing.get_origin(base) in (list, tuple) and isinstance(step, int):
            path += f"[{step}]"
            annotation = typing.get_args(base)[0]
        elif typing.get_origin(base) is dict:
            key_type, value_type = typing.get_args(base)
            if steps and steps[0] == "[key]":
                steps.pop(0)
                return f"{path} key {step!r}", key_type, False
            path += f"[{step!r}]"
            annotation = value_type
        elif isinstance(step, str) and _tagged(base, step) is not None:  # an EitherOf's tag: that kind's fields
            annotation = _tagged(base, step)
        else:  # a union member's tag, or a step the annotation does not explain
            continue
    annotation, optional = _strip(annotation)
    return path, annotation, optional


def _tagged(annotation: Any, tag: str) -> Any:
    """The member of a union `annotation` tagged `tag` (EitherOf), or None."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    return next((member for member in typing.get_args(annotation)
                 if any(isinstance(m, Tag) and m.tag == tag for m in getattr(member, "__metadata__", ()))), None)


def leaf(annotation: Any) -> tuple[Rule | None, Any]:
    """The Rule a field's annotation validates with (through its `| None`), or None, and its Python type."""
    annotation, _ = _strip(annotation)
    return next((m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Rule)), None), _base(annotation)


def _expected_of(annotation: Any) -> str | None:
    for marker in getattr(annotation, "__metadata__", ()):
        if isinstance(marker, (Rule, Expect)):
            return marker.expected
        if isinstance(marker, As):
            return _expected_of(marker.inner)
    base = _base(annotation)
    if _is_model(base) and issubclass(base, Model):
        return base.what
    if _is_record(base):
        return base.what or f"a JSON object of {base.__name__} fields"
    return None


def _lower(message: str) -> str:
    return message[:1].lower() + message[1:]


class Clipped:
    """A long value, shown by the start of its repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def shown(value: Any, limit: int = 200) -> Any:
    """`value`, or a Clipped of its repr when that is longer than `limit` (an error is one line)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested past repr's depth; an int past str()'s digits
        return Clipped(f"<{type(value).__name__} too deep or too long to show>")
    if len(text) <= limit:
        return value
    return Clipped(f"{text[:limit]}... ({len(text)} characters)")


def one_line(text: str) -> str:
    """`text` with its control characters escaped (difftest.core.text.printable): an error stays one line."""
    return printable(text, lines=False)


# --------------------------------------------------------------------------- reading documents

def refuse_link(path: str | Path, field: str, what: str) -> None:
    """SpecError(field, path, ...) when `path` is a symbolic link. A file read back as difftest's own record (a
    bundle's, what --resume names) must be a file of its own: a link may point at anything its reader can read
    (a secret), which an error would then quote, or a run would take for its record."""
    if os.path.islink(path):
        raise SpecError(field, str(path), f"a {what} in a file of its own, not a symbolic link")


def read_text(path: str | Path, field: str, what: str, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of `path`; SpecError(field, path, ...) when it cannot be read, is not a regular
    file (a FIFO would block the read until a writer came, a device never end), is not UTF-8 or is
    larger than `limit` bytes."""
    chunks, size = [], 0
    try:
        # Opened without blocking (a FIFO's open waits for a writer), then checked to be a regular file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SpecError(field, str(path), f"a {what} in a regular file (not a FIFO, device or folder)")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as file:
            # In chunks: file.read(limit + 1) would set aside `limit` bytes before reading any.
            while size <= limit and (chunk := file.read(1 << 20)):
                chunks.append(chunk)
                size += len(chunk)
    except OSError as exc:
        raise SpecError(field, str(path), f"a readable {what} ({exc.strerror or exc})") from None
    if size > limit:
        raise SpecError(field, str(path), f"a {what} of at most {bound_text(limit)} bytes")
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(field, str(path), f"a {what} in UTF-8 (byte {exc.start} is not)") from None


def read_toml(path: str | Path, field: str, what: str) -> dict[str, Any]:
    """The TOML document at `path`; SpecError(field, path, ...) when it cannot be read or parsed.
    Python 3.10 reads TOML through the `tomli` package (3.11+ has tomllib)."""
    text = read_text(path, field, what)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SpecError(field, str(path), f"a {what}, which Python 3.10 reads with tomli (pip install tomli)") \
                from None
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, or an integer past str()'s digits
        raise SpecError(field, str(path), f"a {what} in valid TOML ({one_line(str(exc))})") from None


def parse_json(text: str) -> Any:
    """json.loads, ValueError (never RecursionError) for text that is not JSON, nests too deeply, or
    gives one key twice in an object (json.loads would keep the last silently)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The object of `pairs`; ValueError naming a key given twice."""
    made = dict(pairs)
    if len(made) != len(pairs):
        twice = next(key for key, times in Counter(key for key, _ in pairs).items() if times > 1)
        raise ValueError(f"the key {twice!r} is given twice")
    return made


