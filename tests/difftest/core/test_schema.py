"""difftest.core.schema: every reader (spec JSON, bundles, result streams and reports, ledgers) either loads a
document or refuses it with one SpecError line, `field=value: expected what is allowed`; through the CLI
that is exit 2 and one stderr line, never a traceback.

Property-based: random JSON-ish values, mutations of valid documents (a field dropped, an unknown one
added, a value retyped, out of range, huge, NaN, deeply nested), corrupt, truncated and zip-bomb-shaped
case archives, bad stream lines and bad ledgers. Tensors are built once, at import: the examples only
read and write small files.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import io
import json
import math
import re
import shutil
import tempfile
import tracemalloc
import typing
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pydantic import PlainValidator

from difftest.backends import Origin, as_loaded
from difftest.core import schema
from difftest.core.case_archive import ArchiveMeta, CaseMeta
from difftest.core.contract import Siblings
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus, Isolation, OperationKind, SanitizerTool, TopkRelation
from difftest.core.ragged import RaggedMeta
from difftest.core.schema import to_jsonable
from difftest.core.spec import Stale, Values
from difftest.core.topk import TopkMeta
from difftest.core.verdict import Verdict
from difftest.engine.comparison import Comparison, Mismatch
from difftest.engine.config import RunConfig
from difftest.engine.explain import Example, Explanation, Pattern, Relation, Rounding
from difftest.engine.performance import SiblingRace, SiblingTime
from difftest.engine.result import CallMemory, CaseResult, RaggedViolation, Reach, Selection, TopkViolation, Violation
from difftest.engine.sanitize import Finding, SanitizerReport
from difftest.engine.stability import Stability, StabilityKind
from difftest.engine.timing import Timing
from difftest.generators import CaseSpec, build_case
from difftest.generators.indexer import IndexerSpec, PrefillIndexerSpec
from difftest.generators.ragged import RaggedSpec
from difftest.generators.topk import TopkSpec
from difftest.matrix.definition import Exclude, Include, Suite, load_matrix
from difftest.matrix.merge import Entry, MergedFile
from difftest.records.bundle import CASE_FILE, INFO_FILE, BundleInfo, load_bundle, write_bundle
from difftest.records.ledger import Divergence, LedgerSpecModel, load_ledger
from difftest.records.report import BackendSummary, Report, write_json
from difftest.records.run_info import Phases
from difftest.records.score import MutantScore, SelftestScore
from difftest.records.serialize import ResultStream, load_results
from tests import planted
from tests.support import TINY, run_cli
from tests.support import handmade_zip as _zip

ONE_LINE = re.compile(r"^[^\n]+=[^\n]*: expected [^\n]+$")
FAST = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
WORK = Path(tempfile.mkdtemp(prefix="difftest-schema-"))  # the strategies need the documents at import
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

# --------------------------------------------------------------------------- valid documents, made once

BOUNDARY = as_loaded(planted.block_boundary_off_by_one)
CASE = build_case(TINY.replace(next_n=2, lengths=(7, 8, 0), padding=1), 3)
# What the planted bug gives on CASE, written out (not run: these tests read files, whatever the runner does).
RESULT = CaseResult(
    backend=BOUNDARY.name, case=CASE.name, description=CASE.describe(), rows=CASE.rows, verdict=Verdict.FAIL_MASK,
    device="cpu", encoding=BOUNDARY.contract.length_encoding, layout=BOUNDARY.contract.cache_layout,
    overridden=False, seconds=0.01, spec=CASE.meta["spec"],
    comparison=Comparison(rows=CASE.rows, mask_rows=[2, 3], nan_rows=[], unwritten_rows=[], value_rows=[],
                          positions_differing=2, max_abs_err=math.inf, max_rel_err=math.nan, topk_overlap=0.75,
                          first_mismatch=Mismatch(2, 7, -1.5, -math.inf, Verdict.FAIL_MASK), verdict=Verdict.FAIL_MASK))
FULL = dataclasses.replace(
    RESULT, isolation=Isolation.WORKER, isolation_note="in a worker", mutated_inputs=("q",),
    stability=Stability(StabilityKind.WITHIN_TOLERANCE, 3, [0, 1], [], 1e-7),
    sanitizer=SanitizerReport(SanitizerTool.MEMCHECK, True, None, "compute-sanitizer ...", 99, 2,
                              (Finding("Invalid __global__ read of size 4 bytes", "k", 2, ("thread (0,0,0)",)),),
                              "tail"),
    reach=Reach(("block-boundaries",), 8, CASE.pool_bytes, CASE.batch), gpu="cuda:0 NVIDIA H200",
    traceback='Traceback (most recent call last):\n  File "k.py", line 3, in launch\nRuntimeError: boom\n',
    comparison=dataclasses.replace(
        RESULT.comparison, topk_overlap=None, topk=512, mask_limits=((2, 7, 6), (3, 8, 7)),
        explanation=Explanation(Relation(Pattern.TILE_TRUNCATED, tile=4, rounding=Rounding.DOWN), 2, 2, next_n=2,
                                draft_rows=(0, 1), example=Example(2, 7, 6, 1, 0, 8), right_windows=1,
                                differences=((-1, 2),), alternatives=(Relation(Pattern.CONSTANT_OFFSET, offset=-1),))))
# A top-k result the relations failed: its violation is a TopkViolation (a paged one's a Violation).
TOPK_RELATED = CaseResult(
    backend="mutant-topk-padded-past-window", case="short-s0", description="rows=2 width=64 k=16", rows=2,
    verdict=Verdict.FAIL_METAMORPHIC, device="cpu", encoding=None, layout=None, overridden=False, seconds=0.01,
    spec={"name": "short", "k": 16}, operation=OperationKind.TOPK, headline="0/2 rows select a wrong set",
    selection=Selection(2, (), 0, {}, None),
    metamorphic=(TopkViolation(TopkRelation.ADD_NEG_INF, "short-s0~add-neg-inf", (0, 1), 0, (2.5, 1.0), (2.5, 1.0),
                               14, 0, 14),))
RESULTS = [RESULT, FULL, TOPK_RELATED]
BUNDLE = write_bundle(WORK / "bundles", CASE, RESULT, RunConfig(), BOUNDARY.origin, "planted")
BUNDLE_INFO = json.loads((BUNDLE / INFO_FILE).read_text())
with zipfile.ZipFile(BUNDLE / CASE_FILE) as _archive:
    MEMBERS = {info.filename: _archive.read(info) for info in _archive.infolist()}
ARCHIVE = (BUNDLE / CASE_FILE).read_bytes()
with np.load(BUNDLE / CASE_FILE) as _npz:
    META = json.loads(str(_npz["meta"]))
REPORT = json.loads(write_json(WORK / "report.json", RESULTS, {"command": "difftest run", "seed": 0}).read_text())
_stream = ResultStream(WORK / "stream.jsonl")
_stream.header({"command": "difftest run", "seed": 0, "cases": 1})
for _result in RESULTS:
    _stream.write(_result)
_stream.close()
STREAM_LINES = (WORK / "stream.jsonl").read_text().splitlines()
SPEC = CaseSpec(lengths=(0, 3, 17), padding=1, values=Values.HEAVY, stale=Stale.ZERO, pool_blocks=40,
                high_block_ids=True, extra_columns=1).to_json()
LEDGER = {"divergence": [
    {"backend": "aiter-*", "case": "length-one-*", "reason": "drops the last position", "issue": "example/kernels#12"},
    {"backend": "deepgemm", "case": "*", "spec": {"next_n": 4, "length_dist": "edg*", "lengths": [1, 2]},
     "reason": "next_n = 4 schedule", "issue": "https://github.com/deepseek-ai/DeepGEMM/issues/353"}]}


# --------------------------------------------------------------------------- strategies

EDGES = [0, -1, 1, 15, 16, 17, 2**15, 2**16, 2**22, 2**22 + 1, 2**31 - 1, 2**31, 2**40, 2**63, 2**64, -(2**63) - 1,
         10**30, 0.5, -0.0, 1e308, math.nan, math.inf, -math.inf, True, False, "", "3", "inf", "nan", " ", "\x00",
         "é\n", None, [], {}]
# Copied per draw: a mutation that adds to the drawn {} must not add to EDGES' own (hypothesis then sees
# the same choices draw another document: FlakyStrategyDefinition).
EDGE_VALUES = st.sampled_from(EDGES).map(copy.deepcopy)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | EDGE_VALUES
JSONISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=12)
NEST = "\x00nest:"  # a value replaced, once the document is text, by JSON nested this many levels deep


def _places(doc: Any, out: list | None = None) -> list[tuple[Any, Any]]:
    """(container, key or index) of every value in `doc`, the root's own entries first."""
    out = [] if out is None else out
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        out.append((doc, key))
        _places(value, out)
    return out


def _containers(doc: Any) -> list[Any]:
    return [doc] + [c[k] for c, k in _places(doc) if isinstance(c[k], dict)] if isinstance(doc, dict) else \
        [c[k] for c, k in _places(doc) if isinstance(c[k], dict)]


def _retyped(value: Any) -> Any:
    """The value as another JSON type: the typo a hand-edited file makes."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return str(value) if value % 2 else float(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return 0


@st.composite
def mutated(draw: st.DrawFn, doc: Any, in_memory_depth: int = 300) -> Any:
    """`doc` with one to three mutations; in memory, deep nesting is built directly, in text by NEST."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        places = _places(doc)
        kind = draw(st.sampled_from(["drop", "add", "replace", "retype", "edge", "nest"] if places else ["add"]))
        if kind == "add":
            containers = _containers(doc)
            if containers:
                draw(st.sampled_from(containers))[draw(st.text(min_size=1, max_size=10))] = draw(JSONISH)
            continue
        container, key = draw(st.sampled_from(places))
        if kind == "drop":
            del container[key]
        elif kind == "replace":
            container[key] = draw(JSONISH)
        elif kind == "retype":
            container[key] = _retyped(container[key])
        elif kind == "edge":
            container[key] = draw(EDGE_VALUES)
        else:
            depth = draw(st.integers(1, 5000))
            container[key] = _nested(min(depth, in_memory_depth)) if in_memory_depth else f"{NEST}{depth}"
    return doc


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _text(doc: Any) -> str:
    """JSON text of a mutated document, NEST markers expanded into deep nesting."""
    text = json.dumps(doc)
    return re.sub(r'"\\u0000nest:(\d+)"', lambda m: "[" * int(m.group(1)) + "1" + "]" * int(m.group(1)), text)


# --------------------------------------------------------------------------- what every reader must do

def loads_or_refuses(read: Callable[[], Any]) -> SpecError | None:
    """read(), which may only return or raise one SpecError line."""
    try:
        read()
    except SpecError as exc:
        assert ONE_LINE.match(str(exc)), f"not one 'field=value: expected ...' line: {str(exc)[:500]!r}"
        _event("refused")
        return exc
    _event("loaded")
    return None


def _event(what: str) -> None:
    """Counted in --hypothesis-show-statistics: how many examples loaded and how many were refused."""
    if currently_in_test_context():
        event(what)


def refused_by_cli(argv: list[str]) -> None:
    code, _, err = run_cli(argv)
    assert code == ExitStatus.USAGE, f"{argv=} {code=} {err[-2000:]}"
    # One line, so no Python traceback (the quoted bad value may itself hold the word, escaped: a result's
    # traceback field is text that starts "Traceback (most recent call last):").
    assert err.startswith("difftest: error: ") and err.count("\n") == 1, err[-2000:]
    assert "Traceback (most recent call last):\n" not in err, err[-2000:]


def _folder() -> Path:
    return Path(tempfile.mkdtemp(dir=WORK))


# --------------------------------------------------------------------------- one definition per document

RECORDS = [CaseResult, Comparison, Mismatch, Explanation, Relation, Example, Stability, SanitizerReport, Finding, Reach,
           Origin, Timing, Siblings, BackendSummary, SiblingRace, SiblingTime, CallMemory, CaseSpec, BundleInfo, Report,
           Entry, MergedFile, Divergence, ArchiveMeta, CaseMeta, TopkSpec, TopkMeta, RaggedSpec, RaggedMeta, Suite,
           Include, Exclude, Phases, Selection, Violation, TopkViolation, RaggedViolation, MutantScore, SelftestScore,
           IndexerSpec, PrefillIndexerSpec]


def _bounded(annotation: Any) -> bool:
    """Whether every value `annotation` admits is checked: a rule (or a whole validator, IntList's), a
    record, or a container of those."""
    annotation, _ = schema._strip(annotation)
    metadata = getattr(annotation, "__metadata__", ())
    if any(isinstance(m, (schema.Rule, schema.As, PlainValidator)) for m in metadata):
        return True
    base = schema._base(annotation)
    if isinstance(base, type) and issubclass(base, schema.Record):
        return True
    items = [a for a in typing.get_args(base) if a is not Ellipsis]
    return any(isinstance(m, schema.Expect) for m in metadata) and bool(items) and all(map(_bounded, items))


def _records(kind: type = schema.Record) -> set[type]:
    return {sub for child in kind.__subclasses__() for sub in (child, *_records(child))}


def test_every_record_is_listed_here():
    assert _records() == set(RECORDS), "a new Record: list it in RECORDS, so its fields are checked below"


@pytest.mark.parametrize("record", RECORDS, ids=lambda x: x.__name__)
def test_every_record_field_declares_its_bounds(record):
    """A record is its document's one definition: a field without its rule would read anything back."""
    loose = [key for key, annotation in schema.record_fields(record).items() if not _bounded(annotation)]
    assert not loose, f"{record.__name__} fields without a rule: {loose}"


def test_a_ledger_entry_may_name_every_spec_field():
    assert set(LedgerSpecModel.model_fields) == {f.name for f in dataclasses.fields(CaseSpec)}


def test_valid_documents_load_as_before():
    assert CaseSpec.from_json(SPEC).to_json() == SPEC
    same = _as_json(RESULTS)  # compared as JSON: a NaN error is not == itself
    assert _as_json([CaseResult.from_json(to_jsonable(r), "result.") for r in RESULTS]) == same
    assert _as_json(load_results(WORK / "report.json")) == same == _as_json(load_results(WORK / "stream.jsonl"))
    bundle = load_bundle(BUNDLE)
    assert bundle.case.name == CASE.name and bundle.verdict == RESULT.verdict
    assert to_jsonable(bundle.info) == BUNDLE_INFO
    (WORK / "ledger.toml").write_text(_toml(LEDGER))
    assert [e.spec for e in load_ledger(WORK / "ledger.toml").entries][1] == (
        ("length_dist", "edg*"), ("lengths", [1, 2]), ("next_n", 4))


def _as_json(results: list[CaseResult]) -> str:
    return json.dumps(to_jsonable(results))


@pytest.mark.parametrize("doc, field, expected", [
    ({"lengths": [3, 300]}, "lengths[1]", "[0, max_model_len = 256]"),
    ({"batch": "4"}, "batch", "an integer in [1, 2^24]"),
    ({"batch": True}, "batch", "an integer"),
    ({"shared_blocks": 1}, "shared_blocks", "true or false"),
    ({"head_dim": 24}, "head_dim", "a multiple of 16"),
    ({"next_n": 17}, "next_n", "[1, 16]"),
    ({"fp8": "e5m2"}, "fp8", "one of ['e4m3fn', 'e4m3fnuz']"),
    ({"max_model_len": 2**22, "batch": 2**20}, "logits", "at most 2^36"),
    ({"pool_blocks": 2**34}, "pool_blocks", "at most 2^40 bytes"),
    ({"nxt_n": 2}, "spec", "fields among ["),
])
def test_a_spec_error_names_the_field_the_value_and_what_is_allowed(doc, field, expected):
    with pytest.raises(SpecError) as info:
        CaseSpec.from_json(doc)
    assert info.value.field == field and expected in info.value.expected, f"{info.value}"


def test_a_resume_error_names_the_option_the_value_and_where():
    path = WORK / "bad.jsonl"
    line = json.loads(STREAM_LINES[1])
    line["result"]["verdict"] = "PAS"
    path.write_text("\n".join([STREAM_LINES[0], json.dumps(line)]) + "\n")
    with pytest.raises(SpecError) as info:
        load_results(path)
    assert (info.value.field, info.value.value) == ("resume", "PAS"), f"{info.value}"
    assert info.value.expected.endswith(f"at {path}:2 result.verdict"), f"{info.value}"


# --------------------------------------------------------------------------- spec JSON

@settings(max_examples=300, **FAST)
@given(doc=JSONISH)
def test_spec_reader_on_any_json(doc):
    loads_or_refuses(lambda: CaseSpec.from_json(doc))


@settings(max_examples=400, **FAST)
@given(doc=mutated(SPEC))
def test_spec_reader_on_mutated_specs(doc):
    loads_or_refuses(lambda: CaseSpec.from_json(doc))


@settings(max_examples=120, **FAST)
@given(doc=mutated(SPEC, in_memory_depth=0))
def test_cli_refuses_a_bad_spec_in_one_line(doc):
    text = _text(doc)
    try:
        error = loads_or_refuses(lambda: CaseSpec.from_json(json.loads(text)))
    except RecursionError:  # JSON past the parser's depth: the CLI must still refuse it in one line
        error = "too deep"
    if error is not None:  # a spec that loads would run: only refusals go through the CLI
        refused_by_cli(["run", "--backends", "torch", "--no-progress", "--spec", text])


# --------------------------------------------------------------------------- results, streams and reports

@settings(max_examples=150, **FAST)
@given(doc=JSONISH)
def test_result_reader_on_any_json(doc):
    loads_or_refuses(lambda: CaseResult.from_json(doc, "result."))


@settings(max_examples=350, **FAST)
@given(doc=st.sampled_from([to_jsonable(r) for r in RESULTS]).flatmap(mutated))
def test_result_reader_on_mutated_results(doc):
    loads_or_refuses(lambda: CaseResult.from_json(doc, "result."))


@pytest.mark.parametrize("relation", [["add-neg-inf"], {"add-neg-inf": 1}])
def test_result_reader_refuses_a_violation_whose_relation_is_not_a_name(relation):
    """Found by the mutation test above: an unhashable relation made the violation's kind lookup raise TypeError."""
    doc = to_jsonable(TOPK_RELATED)
    doc["metamorphic"][0]["relation"] = relation
    assert loads_or_refuses(lambda: CaseResult.from_json(doc, "result.")) is not None


def _stream_text(draw: st.DrawFn) -> str:
    lines = list(STREAM_LINES)
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["mutate", "garbage", "drop", "swap", "json"]))
        if how == "mutate" and lines[index] in STREAM_LINES:
            lines[index] = _text(draw(mutated(json.loads(lines[index]), in_memory_depth=0)))
        elif how == "garbage":
            lines[index] = draw(st.text(max_size=40))
        elif how == "drop":
            lines.pop(index) if len(lines) > 1 else None
        elif how == "swap" and lines[index] in STREAM_LINES:
            record = json.loads(lines[index])
            lines[index] = json.dumps({"result" if "run" in record else "run": next(iter(record.values()))})
        elif how == "json":
            lines[index] = json.dumps(draw(JSONISH))
    text = "\n".join(lines) + draw(st.sampled_from(["\n", ""]))
    return text[:draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


@st.composite
def result_files(draw: st.DrawFn) -> bytes:
    """A stream or report, mutated, truncated, or not text at all."""
    kind = draw(st.sampled_from(["stream", "report", "bytes", "json"]))
    if kind == "stream":
        return _stream_text(draw).encode()
    if kind == "report":
        text = _text(draw(mutated(REPORT, in_memory_depth=0)))
        return text[:draw(st.integers(0, len(text)))].encode() if draw(st.booleans()) else text.encode()
    if kind == "json":
        return json.dumps(draw(JSONISH)).encode()
    return draw(st.binary(max_size=64))


@settings(max_examples=400, **FAST)
@given(data=result_files())
def test_results_reader_on_bad_streams_and_reports(data):
    path = WORK / "results.json"
    path.write_bytes(data)
    loads_or_refuses(lambda: load_results(path))


RESUME = ["run", "--backends", "torch", "--cases", "edges", "--case-filter", "length-one-*", "--no-progress"]


@settings(max_examples=80, **FAST)
@given(data=result_files())
def test_cli_refuses_a_bad_resume_file_in_one_line(data):
    path = _folder() / "resume.jsonl"
    path.write_bytes(data)
    if loads_or_refuses(lambda: load_results(path)) is not None:  # a file that loads would resume a run
        refused_by_cli([*RESUME, "--resume", str(path)])


# --------------------------------------------------------------------------- bundles: bundle.json

def _bundle(info: str | bytes | None = None, archive: bytes | None = None) -> Path:
    folder = _folder() / "b"
    folder.mkdir()
    info = json.dumps(BUNDLE_INFO) if info is None else info
    (folder / INFO_FILE).write_bytes(info.encode() if isinstance(info, str) else info)
    (folder / CASE_FILE).write_bytes(ARCHIVE if archive is None else archive)
    return folder


@settings(max_examples=250, **FAST)
@given(info=st.one_of(mutated(BUNDLE_INFO, in_memory_depth=0).map(_text), JSONISH.map(json.dumps),
                      st.binary(max_size=32)))
def test_bundle_reader_on_mutated_bundle_json(info):
    folder = _bundle(info=info)
    if loads_or_refuses(lambda: load_bundle(folder)) is not None:
        refused_by_cli(["replay", str(folder)])


# --------------------------------------------------------------------------- bundles: case.npz

def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _meta(meta: Any) -> bytes:
    return _npy(np.array(_text(meta)))


ARRAYS = st.builds(
    lambda dtype, shape: np.zeros(shape, dtype=dtype),
    st.sampled_from(["u1", "i1", "<f4", "<f8", "<i4", "<i8", ">f4", "c8", "?", "U3", "V4"]),
    st.lists(st.integers(0, 5), max_size=5).map(tuple))


@st.composite
def archives(draw: st.DrawFn) -> bytes:
    """case.npz, broken one way or another."""
    members = list(MEMBERS.items())
    kind = draw(st.sampled_from(["truncate", "flip", "drop", "extra", "duplicate", "array", "pickle", "meta",
                                 "declared", "trailing", "flags", "method", "bytes"]))
    if kind == "truncate":
        return ARCHIVE[:draw(st.integers(0, len(ARCHIVE) - 1))]
    if kind == "flip":
        data = bytearray(ARCHIVE)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(data)
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    index = draw(st.integers(0, len(members) - 1))
    name = members[index][0]
    if kind == "drop":
        members.pop(index)
    elif kind == "extra":
        extra = draw(st.sampled_from(["expected.npy", "x.npy", "q", "../q.npy", "meta.npy/", ""]))
        members.append((extra, _npy(draw(ARRAYS))))
    elif kind == "duplicate":
        members.append(members[index])
    elif kind == "array":
        members[index] = (name, _npy(draw(ARRAYS)))
    elif kind == "pickle":
        members[index] = (name, _npy(np.array([{"x": 1}, None], dtype=object)))
    elif kind == "meta":
        members = [(n, _meta(draw(mutated(META, in_memory_depth=0))) if n == "meta.npy" else d) for n, d in members]
    elif kind == "declared":
        size = draw(st.sampled_from([0, 1, len(members[index][1]) - 1, len(members[index][1]) + 1, 2**31, 2**32 - 1]))
        return _zip(members, declared={name: size})
    elif kind == "trailing":  # a deflate stream that inflates past what its member declares: a zip bomb's shape
        return _zip(members, trailing={name: b"\0" * draw(st.integers(1, 1 << 16))})
    elif kind == "flags":
        return _zip(members, flags=draw(st.sampled_from([1, 8, 0x41])))
    else:
        return _zip(members, method=draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_BZIP2, 99])))
    return _zip(members)


@settings(max_examples=350, **FAST)
@given(archive=archives())
def test_bundle_reader_on_broken_archives(archive):
    folder = _bundle(archive=archive)
    if loads_or_refuses(lambda: load_bundle(folder)) is not None and archive[:1] == b"P":
        refused_by_cli(["replay", str(folder)])


def _peak_bytes(read: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        loads_or_refuses(read)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_member_that_inflates_past_its_declared_size_is_never_inflated():
    bomb = _zip(list(MEMBERS.items()), trailing={"kv_cache.npy": b"\0" * (256 << 20)})
    assert len(bomb) < (1 << 20), "256 MB of zeros deflate to under 1 MB"
    folder = _bundle(archive=bomb)
    assert _peak_bytes(lambda: load_bundle(folder)) < 16 << 20


def test_a_member_declaring_more_than_its_bytes_can_hold_is_refused_before_it_is_read():
    meta = {**META, "B": 2**20, "seq_lens": [0] * 2**20}
    meta.pop("spec")
    q = _npy(np.zeros((1, 2, 2, 16), np.uint8)).replace(b"(1, 2, 2, 16)", b"(1048576, 2, 2, 16)")
    members = [(n, _meta(meta) if n == "meta.npy" else q if n == "q.npy" else d) for n, d in MEMBERS.items()]
    header = len(q) - 64
    folder = _bundle(archive=_zip(members, declared={"q.npy": header + 2**20 * 64}))
    with pytest.raises(SpecError, match=r"q\.npy size=.*what its \d+ bytes in the archive can hold"):
        load_bundle(folder)
    assert _peak_bytes(lambda: load_bundle(folder)) < 16 << 20


def test_tensors_are_checked_against_the_spec_they_were_drawn_from():
    meta = copy.deepcopy(META)
    meta["spec"]["heads"] = 4
    members = [(n, _meta(meta) if n == "meta.npy" else d) for n, d in MEMBERS.items()]
    with pytest.raises(SpecError) as info:
        load_bundle(_bundle(archive=_zip(members)))
    assert info.value.field.endswith("case.npz meta.H") and "spec.heads = 4" in info.value.expected, f"{info.value}"


# --------------------------------------------------------------------------- ledgers

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (int, str)):
        return json.dumps(value) if isinstance(value, str) else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    return '"null"'


def _toml(doc: Any) -> str:
    """A TOML rendering of a JSON-ish document: [[divergence]] tables for a list of tables there, a
    `key = value` line otherwise (TOML has no null: None becomes "null")."""
    if not isinstance(doc, dict):
        return f"value = {_toml_value(doc)}\n"
    lines = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for table in value:
                lines.append(f"[[{json.dumps(key)}]]")
                lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
        else:
            lines.insert(0, f"{json.dumps(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


@st.composite
def toml_texts(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    """TOML files for a reader of documents like `valid`: mutated or truncated copies of it, any
    document, any bytes, arrays nested past the parser's depth."""
    kind = draw(st.sampled_from(["mutated", "mutated", "truncated", "any", "bytes", "deep"]))
    if kind == "mutated":
        return _toml(draw(mutated(valid, in_memory_depth=20))).encode()
    if kind == "truncated":
        text = _toml(valid)
        return text[:draw(st.integers(0, len(text)))].encode()
    if kind == "any":
        return _toml(draw(JSONISH)).encode()
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        return f"value = {'[' * depth}1{']' * depth}\n".encode()
    return draw(st.binary(max_size=64))


@settings(max_examples=350, **FAST)
@given(text=toml_texts(LEDGER))
def test_ledger_reader_on_bad_ledgers(text):
    path = WORK / "ledger-fuzz.toml"
    path.write_bytes(text)
    loads_or_refuses(lambda: load_ledger(path))


def test_unreadable_files_are_spec_errors_too():
    folder = _folder()
    (folder / "dir.toml").mkdir()
    for read in (lambda: load_results(folder / "missing.jsonl"), lambda: load_results(folder),
                 lambda: load_ledger(folder / "dir.toml"), lambda: load_bundle(folder)):
        assert loads_or_refuses(read) is not None
    shutil.rmtree(folder)


# --------------------------------------------------------------------------- matrix files

MATRIX = schema.read_toml(Path(__file__).parents[3] / "examples" / "ci" / "difftest.toml", "file", "a matrix file")


@settings(max_examples=300, **FAST)
@given(text=toml_texts(MATRIX))
def test_matrix_reader_on_bad_matrix_files(text):
    path = WORK / "matrix-fuzz.toml"
    path.write_bytes(text)
    loads_or_refuses(lambda: load_matrix(path))
