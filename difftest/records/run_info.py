"""How a run was made: the schema of a report's `run` and of a stream's {"run": ...} lines.

Run info is a JSON object the workflows build as they go (difftest.workflows.session, the pytest plugin,
a fuzz campaign, a spread run): it has no dataclass of its own, so these Models are its one
definition, read where a report or stream is (difftest.records.report.Report, difftest.records.serialize).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from pydantic import Field

from difftest.core.hardware import DeviceKind
from difftest.core.kinds import CacheLayout, CaseKind, Device, LengthEncoding, OperationKind, OracleKind, SanitizerTool
from difftest.core.schema import (
    MAX_COMMAND,
    MAX_ITEMS,
    MAX_NAME,
    MAX_TEXT,
    Bool,
    Count,
    Float,
    Int,
    ListOf,
    Model,
    Name,
    Names,
    Number,
    OneOf,
    Record,
    Rule,
    Seed,
    TableOf,
    Text,
)
from difftest.core.verdict import Verdict
from difftest.engine.config import MAX_REPEAT, MAX_TIME

Verdicts = OneOf(Verdict)


class OmittedModel(Model):
    what: ClassVar[str] = "a JSON object {family, reason}"
    family: Name
    reason: Text()


class PlanInfoModel(Model):
    """The `plan` of an envelope run's info (difftest.workflows.session)."""

    what: ClassVar[str] = "a JSON object {omitted, idle, cases}"
    omitted: TableOf(Name, ListOf(OmittedModel, MAX_ITEMS, "a list of {family, reason}"),
                     "a table of backend -> [{family, reason}]") = Field(default_factory=dict)
    idle: TableOf(Name, Text(), "a table of backend -> why it ran nothing") = Field(default_factory=dict)
    cases: Count = 0


class ShardInfoModel(Model):
    """One entry of a spread run's `shards` (difftest.workflows.spread.ShardRun.info)."""

    what: ClassVar[str] = "a JSON object of a shard's fields"
    shard: Text(64)
    env: TableOf(Text(MAX_NAME), Text(), "a table of environment variables")
    exit: Text()
    died: Bool
    results: Count
    expected: Count
    log: Text()


class MatrixRunModel(Model):
    """The `matrix` of a report `difftest matrix run` wrote: which cell of the matrix it is
    (difftest.matrix.cell)."""

    what: ClassVar[str] = "a JSON object {cell, device, version, library, suite}"
    cell: Name
    device: OneOf(DeviceKind)
    version: Name
    library: Text(MAX_NAME)
    suite: Name


class VariantsModel(Model):
    """The variants of one fuzz signature (difftest.workflows.signatures.Variants.to_json), each with its count."""

    what: ClassVar[str] = "a JSON object {draft_rows, kinds, shapes}"
    draft_rows: TableOf(Name, Count, "a table of draft row -> results") = Field(default_factory=dict)
    kinds: TableOf(Name, Count, "a table of kinds of wrong rows -> results") = Field(default_factory=dict)
    shapes: TableOf(Name, Count, "a table of case shape -> results") = Field(default_factory=dict)


class AlsoModel(Model):
    """Another signature whose cases shrank to a fuzz signature's shrunk case, with its count."""

    what: ClassVar[str] = "a JSON object {backend, verdict, pattern, error, results}"
    backend: Name
    verdict: Verdicts
    pattern: Name | None = None
    error: Name | None = None
    results: Count


class SignatureInfoModel(Model):
    """One signature of a fuzz campaign's report (difftest.workflows.fuzz.campaign_info)."""

    what: ClassVar[str] = "a JSON object of signature fields"
    backend: Name
    verdict: Verdicts
    pattern: Name | None = None  # difftest.engine.explain.Pattern's value (the explainer may add patterns)
    error: Name | None = None
    results: Count
    first: Name
    description: Text() = ""
    also: ListOf(AlsoModel, MAX_ITEMS, "a list of signatures") = Field(default_factory=list)
    variants: VariantsModel = VariantsModel()
    bundle: Text() | None = None
    shrunk: Text() | None = None
    shrunk_bundle: Text() | None = None
    unshrunk: Text() | None = None
    repro: Text(MAX_COMMAND) | None = None
    replay: Text(MAX_COMMAND) | None = None


@dataclasses.dataclass(frozen=True)
class Phases(Record):
    """Where a fuzz campaign's time went, in seconds of its own clock (difftest.workflows.fuzz): its one
    definition, what the campaign records and its run info's `phases`."""

    what = "a JSON object {cases, shrinking, total}"
    # from its start until the last case's result: drawing and running, workers started and stopped
    cases: Float(0.0, math.inf)
    shrinking: Float(0.0, math.inf)  # then bundling and shrinking the signatures found
    total: Float(0.0, math.inf)  # the whole campaign


class CampaignInfoModel(Model):
    """The `campaign` of a fuzz campaign's run info (difftest.workflows.fuzz.campaign_info)."""

    what: ClassVar[str] = "a JSON object of campaign fields"
    shrink_seconds: Number()
    jobs: Int(1, 1 << 16) = 1
    phases: Phases
    bundles: Text() | None = None
    signatures: ListOf(SignatureInfoModel, MAX_ITEMS, "a list of signatures") = Field(default_factory=list)


class RunInfoModel(Model):
    """How a run was made: the `run` of a report and of a stream's {"run": ...} lines, as difftest.workflows.session
    and the pytest plugin write it. Every field is optional (a report may carry an empty one)."""

    what: ClassVar[str] = "a JSON object of run fields"
    command: Text(MAX_COMMAND) | None = None
    seed: Seed | None = None
    cases: Rule(lambda v: (type(v) is int and 0 <= v < 1 << 63) or (type(v) is str and len(v) <= MAX_NAME),
                "a number of cases, or the suite's name").type() | None = None
    device: OneOf(Device) | None = None
    backends: Names | None = None
    gpu: Text(MAX_NAME) | None = None
    torch: Text(MAX_NAME) | None = None
    difftest: Text(MAX_NAME) | None = None
    python: Text(MAX_NAME) | None = None
    started: Text(64) | None = None
    seconds: Number(0.0, math.inf) | None = None
    encoding_override: OneOf(LengthEncoding) | None = None
    layout_override: OneOf(CacheLayout) | None = None
    isolated: Bool | None = None
    timeout: Number(0.0, math.inf) | None = None
    repeat: Int(1, MAX_REPEAT) | None = None
    sanitize: OneOf(SanitizerTool) | None = None
    sanitize_all: Bool | None = None
    oracle: OneOf(OracleKind) | None = None
    cases_kind: OneOf(CaseKind) | None = None
    budget: Number(0.0, math.inf) | None = None
    operation: OneOf(OperationKind) | None = None  # runs of paged logits (and those before operations) have none
    case_filter: ListOf(Text(MAX_NAME), MAX_ITEMS, "a list of fnmatch patterns") | None = None
    shard: Text(64) | None = None
    resumed_from: Text(MAX_TEXT) | None = None
    resumed: Count | None = None
    not_started: Names | None = None
    plan: PlanInfoModel | None = None
    shards: ListOf(ShardInfoModel, 4096, "a list of shard records") | None = None
    incomplete: Bool | None = None  # the run was interrupted: the report holds what finished
    startup_timeout: Number(0.0, math.inf) | None = None
    time: Int(1, MAX_TIME) | None = None  # timed launches per case
    fail_slow: Bool | None = None  # a sibling slower than allowed fails the run
    graph: Bool | None = None  # each case replayed in its captured call (difftest.engine.graph)
    matrix: MatrixRunModel | None = None  # the matrix cell the run was (difftest matrix run)
    campaign: CampaignInfoModel | None = None  # what a fuzz campaign found (difftest fuzz --report)
