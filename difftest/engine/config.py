"""RunConfig: how backends are fed and guarded in one run. Errors name these fields, never CLI flags."""

from __future__ import annotations

import dataclasses
import math

from difftest.core.errors import require
from difftest.core.kinds import RELATIONS, AnyRelation, CacheLayout, LengthEncoding, OracleKind, SanitizerTool

DEVICES = ("cpu", "cuda")
MAX_REPEAT = 1000  # launches per case; more is a typo, not a stability study
MAX_TIME = 1000  # timed launches per case; more is a typo, not a measurement
MAX_STARTUP_TIMEOUT = 86400.0  # seconds: a worker start-up wait is bounded, however slow its library


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """How backends are fed: the device, what-if overrides of their declared contract, and the guards."""

    device: str = "cpu"
    encoding: LengthEncoding | None = None
    layout: CacheLayout | None = None
    isolate: bool | None = None  # a worker process per backend; None: on for cuda (or a timeout), off for cpu
    timeout: float | None = None  # seconds a case may take in a worker, all launches; None: isolate.DEFAULT_TIMEOUT
    repeat: int = 1  # launches per case; more than one classifies the backend's stability
    sanitize: SanitizerTool | None = None  # a compute-sanitizer tool to replay failing results under
    sanitize_all: bool = False  # replay every result that ran, not only the failing ones
    oracle: OracleKind | None = None  # None: FAST on cuda, EXACT on cpu
    startup_timeout: float = 600.0  # seconds a worker may take to import and build its backend (a JIT library)
    time: int | None = None  # launches timed per case after the checked ones (median; engine.timing); None: none
    # Metamorphic relations checked on every result that ran, one operation's (difftest.core.kinds.RELATIONS:
    # paged logits' difftest.engine.metamorphic, top-k's difftest.engine.topk_metamorphic, ragged logits'
    # difftest.engine.ragged_metamorphic): a violated one is FAIL(metamorphic), each check a launch of each related
    # case (paged logits: and one more of the case)
    metamorphic: tuple[AnyRelation, ...] = ()
    # Each backend's call also captured once per case and replayed on the case's replay family, written into the
    # captured buffers in place (a CUDA graph on cuda): difftest.engine.graph; paged logits only
    graph: bool = False

    def __post_init__(self) -> None:
        require(self.device in DEVICES, "device", self.device, f"one of {list(DEVICES)}")
        require(self.encoding is None or isinstance(self.encoding, LengthEncoding), "encoding", self.encoding,
                f"None or a difftest.LengthEncoding {[e.value for e in LengthEncoding]}")
        require(self.layout is None or isinstance(self.layout, CacheLayout), "layout", self.layout,
                f"None or a difftest.CacheLayout {[c.value for c in CacheLayout]}")
        require(self.isolate in (None, True, False), "isolate", self.isolate, "None, True or False")
        require(type(self.repeat) is int and 1 <= self.repeat <= MAX_REPEAT, "repeat", self.repeat,
                f"an integer in [1, {MAX_REPEAT}]")
        require(self.timeout is None or (isinstance(self.timeout, (int, float)) and 0 < self.timeout < math.inf),
                "timeout", self.timeout, "a finite number of seconds > 0")
        require(isinstance(self.startup_timeout, (int, float)) and 0 < self.startup_timeout <= MAX_STARTUP_TIMEOUT,
                "startup_timeout", self.startup_timeout, f"a number of seconds in (0, {MAX_STARTUP_TIMEOUT:g}]")
        require(self.timeout is None or self.isolate is not False, "timeout", self.timeout,
                "isolation (a call is cut short by killing its worker), not isolate=False")
        require(self.sanitize is None or isinstance(self.sanitize, SanitizerTool), "sanitize", self.sanitize,
                f"None or a difftest.SanitizerTool {[t.value for t in SanitizerTool]}")
        require(not self.sanitize_all or self.sanitize is not None, "sanitize_all", self.sanitize_all,
                "a sanitize tool to go with it")
        require(self.oracle is None or isinstance(self.oracle, OracleKind), "oracle", self.oracle,
                f"None or a difftest.OracleKind {[o.value for o in OracleKind]}")
        require(self.time is None or (type(self.time) is int and 1 <= self.time <= MAX_TIME), "time", self.time,
                f"an integer in [1, {MAX_TIME}]: launches timed per case (None: no timing)")
        require(type(self.graph) is bool, "graph", self.graph, "True or False")
        relations = self.metamorphic
        require(isinstance(relations, tuple) and all(isinstance(r, AnyRelation) for r in relations)
                and len({type(r) for r in relations}) <= 1 and len(set(relations)) == len(relations), "metamorphic",
                relations, "a tuple of distinct relations of one operation: " + "; ".join(
                    f"{kind.value}: {[r.value for r in relation]}" for kind, relation in RELATIONS.items()))

    @property
    def isolated(self) -> bool:
        """Whether backends run in worker processes: as asked, else on cuda or with a timeout."""
        if self.isolate is not None:
            return self.isolate
        return self.device == "cuda" or self.timeout is not None

    @property
    def oracle_kind(self) -> OracleKind:
        """The oracle this run compares against: as asked, else the fused one on a GPU."""
        return self.oracle or (OracleKind.FAST if self.device == "cuda" else OracleKind.EXACT)

    @property
    def overridden(self) -> bool:
        """Whether every backend is handed another encoding or layout than it declares."""
        return self.encoding is not None or self.layout is not None
