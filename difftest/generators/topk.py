"""Top-k cases: TopkSpec (the small seeded description), build_topk_case (its tensors), the default random
suite, and the edge families derived from a TopkContract's declared facts at a Target's scale.

Every family names what it reaches and why it matters (docs/reference/topk.md lists them with the upstream
reports behind them); a family the contract cannot take, or the scale leaves out, is a TopkOmission that
says why, with the numbers.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import torch

from difftest.core.errors import require
from difftest.core.kinds import WindowForm
from difftest.core.schema import Int, IntList, Member, Record, Text, validate
from difftest.core.topk import MAX_ROWS, MAX_WIDTH, TopkCase, TopkContract, decode_ends
from difftest.generators.envelope import Scale, Target

MAX_ELEMENTS = 1 << 33  # rows * row_stride of one case: 32 GiB of float32, past any GPU's headroom
# Columns past the width of a storage row: larger than every logit (but TopkValues.EXTREME's largest finite), so a
# kernel walking rows at the wrong stride ranks them first. Values outside a window under Outside.HOSTILE: large,
# distinct, below it.
STRIDE_PADDING = 3.0e38
HOSTILE = 1.0e30
# TopkValues.EXTREME's magnitudes besides N(0, 1): a denormal's scale (times U(0, 1)), the least normal, zero and
# the largest finite float32, each drawn with either sign.
EXTREMES = (2.0 ** -126, 2.0 ** -126, 0.0, float(torch.finfo(torch.float32).max))
DEFAULT_KS = (512, 1024, 2048)  # what DeepSeek-V3.2 (2048), GLM-5.x and the kernels' instantiations use


class TopkValues(str, enum.Enum):
    """What the logits inside each window are drawn from."""

    NORMAL = "normal"  # N(0, 1)
    HEAVY = "heavy"  # sign * 2^N(0, 8): magnitudes over many binades, every radix digit busy
    INTEGER = "integer"  # integers in [-16, 16]: rows full of exact ties
    EQUAL = "equal"  # every value 1.0: all-equal rows
    CROWDED = "crowded"  # uniform in [1.0, 1.245): distinct floats in one coarse (fp16 top-byte) bin, vllm#51782
    TIED = "tied"  # `above` distinct values in [2, 3), then `ties` values exactly 1.0, the rest in [-1, 0)
    # the ends of float32, each of either sign, among N(0, 1) values: denormals (down to 2^-149), the least
    # normal 2^-126, 0.0 and -0.0, and the largest finite 3.4028235e38 (EXTREMES)
    EXTREME = "extreme"


class WindowDist(str, enum.Enum):
    """How each row's window [start, end) is drawn (explicit starts and ends override it)."""

    FULL = "full"  # [0, width)
    PREFIX = "prefix"  # [0, end), end uniform on [0, width]
    RAGGED = "ragged"  # start uniform on [0, width], end uniform on [start, width]: prefill's windows
    DECODE = "decode"  # the decode rule: L uniform on [0, width] per request, row j ends at max(L - next_n + j + 1, 0)


class Outside(str, enum.Enum):
    """What the columns of a row outside its window hold."""

    HOSTILE = "hostile"  # larger than every logit in the window: a kernel reading past its window selects them
    NEG_INF = "neg-inf"  # -inf, as a caller that cleans its logits leaves them
    RANDOM = "random"  # drawn like the window: an uncleaned tail (DeepGEMM's compressed logits)


def _count_list(what: str, least: int = 0) -> Any:
    return IntList(0, MAX_WIDTH, MAX_ROWS, what, least=least, as_tuple=True)


@dataclasses.dataclass(frozen=True)
class TopkSpec(Record):
    """Structure and distributions of a top-k case. Per-row counts (`ties`, `finite`) cycle over the rows.
    The spec's one definition: its fields, their defaults and (Annotated) the bounds a spec read from JSON
    keeps (TopkSpec.from_json)."""

    name: Text(256, 1) = "random"
    rows: Int(1, MAX_ROWS) = 4
    width: Int(1, MAX_WIDTH) = 256
    k: Int(1, MAX_WIDTH) = 64
    row_stride: Int(1, MAX_WIDTH) | None = None  # None: width (contiguous rows)
    windows: Member(WindowDist) = WindowDist.RAGGED
    # explicit windows: one start and one end per row
    starts: _count_list(f"a list of window starts in [0, {MAX_WIDTH}]") | None = None
    ends: _count_list(f"a list of window ends in [0, {MAX_WIDTH}]") | None = None
    next_n: Int(1, 16) = 1  # rows per request (the decode rule)
    values: Member(TopkValues) = TopkValues.NORMAL
    ties: _count_list("a list of 1 or more tie counts", least=1) = (0,)  # TIED: values equal to the k-th, per row
    # TIED: values above the ties; None: k // 2 moved into [k - ties, k - 1] (straddling)
    above: Int(0, MAX_WIDTH) | None = None
    # candidates kept per row; the window's other positions are -inf
    finite: _count_list("a list of 1 or more candidate counts", least=1) | None = None
    nans: Int(0, MAX_WIDTH) = 0  # NaN positions per row
    pos_infs: Int(0, MAX_WIDTH) = 0  # +inf positions per row (SGLang forces +inf on the tokens it must keep)
    outside: Member(Outside) = Outside.HOSTILE

    @property
    def stride(self) -> int:
        return self.width if self.row_stride is None else self.row_stride

    def replace(self, **changes: Any) -> TopkSpec:
        return dataclasses.replace(self, **changes)

    def validate(self) -> TopkSpec:
        """SpecError naming the first field that cannot describe a case."""
        require(1 <= self.rows <= MAX_ROWS, "rows", self.rows, f"an integer in [1, {MAX_ROWS}]")
        require(1 <= self.width <= MAX_WIDTH, "width", self.width, f"an integer in [1, {MAX_WIDTH}]")
        require(self.k >= 1, "k", self.k, "an integer >= 1")
        require(self.stride >= self.width, "row_stride", self.row_stride, f"at least width = {self.width}")
        require(self.rows * self.stride <= MAX_ELEMENTS, "rows", self.rows,
                f"rows * row_stride <= {MAX_ELEMENTS} (row_stride {self.stride})")
        require(self.next_n >= 1 and self.rows % self.next_n == 0, "next_n", self.next_n,
                f"an integer >= 1 dividing rows = {self.rows}")
        require((self.starts is None) == (self.ends is None), "starts", self.starts, "given together with ends")
        if self.starts is not None and self.ends is not None:
            require(len(self.starts) == self.rows and len(self.ends) == self.rows, "starts", len(self.starts),
                    f"{self.rows} starts and {self.rows} ends (one window per row)")
            require(all(0 <= s <= e <= self.width for s, e in zip(self.starts, self.ends, strict=True)), "ends",
                    self.ends, f"windows with 0 <= start <= end <= width = {self.width}")
        require(len(self.ties) >= 1 and min(self.ties) >= 0, "ties", self.ties, "one or more counts >= 0")
        require(self.finite is None or (len(self.finite) >= 1 and min(self.finite) >= 0), "finite", self.finite,
                "None or one or more counts >= 0")
        require(self.above is None or self.above >= 0, "above", self.above, "None or an integer >= 0")
        require(self.nans >= 0 and self.pos_infs >= 0, "nans", (self.nans, self.pos_infs), "counts >= 0")
        return self

    @classmethod
    def from_json(cls, data: object, where: str = "") -> TopkSpec:
        """The spec of to_json's JSON (fields left out keep their defaults); SpecError naming the first field
        that does not fit ('ties[2]'), or that validate() refuses."""
        return validate(cls, data, where, root="spec").validate()

    def checked(self) -> None:
        """The logits a case of this spec allocates, bounded (a spec read from JSON)."""
        require(self.rows * self.stride <= MAX_ELEMENTS, "spec.rows", self.rows,
                f"rows * row_stride <= {MAX_ELEMENTS} (row_stride {self.stride})")


# --------------------------------------------------------------------------- building

def topk_case_name(spec: TopkSpec, seed: int) -> str:
    """'ties-straddle-k512-s3': the name of the case drawn from (spec, seed)."""
    return f"{spec.name}-s{seed}"


def build_topk_case(spec: TopkSpec, seed: int, device: str | torch.device = "cpu") -> TopkCase:
    """The case `spec` describes, drawn from torch.Generator(device).manual_seed(seed); the same (spec, seed,
    device type) always gives bit-identical tensors. No Python loop over rows or columns: each row's window
    is put in a random order once (a rank per column), and every count of the spec (above, ties, finite,
    NaN, +inf) takes a range of those ranks."""
    spec = spec.validate()
    gen = torch.Generator(device=device).manual_seed(seed)
    starts, ends = _windows(spec, gen, device)
    columns = torch.arange(spec.width, device=device)
    inside = (columns >= starts[:, None]) & (columns < ends[:, None])
    keys = torch.where(inside, torch.rand(spec.rows, spec.width, generator=gen, device=device), 2.0)
    rank = keys.argsort(dim=1).argsort(dim=1)  # each window column's place in a random order of its window
    lens = ends - starts
    values = _special(spec, _drawn(spec, rank, gen, device), rank, lens)
    values = torch.where(inside, values, _outside(spec, values.shape, gen, device))
    storage = torch.full((spec.rows, spec.stride), STRIDE_PADDING, dtype=torch.float32, device=device)
    storage[:, :spec.width] = values
    return TopkCase(name=topk_case_name(spec, seed), storage=storage, width=spec.width, starts=starts, ends=ends,
                    k=spec.k, next_n=spec.next_n, meta={"seed": seed, "spec": spec.to_json()}).validate()


def _windows(spec: TopkSpec, gen: torch.Generator, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 [rows] starts and ends."""
    i64, rows, width = torch.int64, spec.rows, spec.width
    if spec.starts is not None and spec.ends is not None:
        return (torch.tensor(spec.starts, dtype=i64, device=device), torch.tensor(spec.ends, dtype=i64, device=device))
    zeros = torch.zeros(rows, dtype=i64, device=device)
    if spec.windows == WindowDist.FULL:
        return zeros, torch.full((rows,), width, dtype=i64, device=device)
    if spec.windows == WindowDist.DECODE:
        seq_lens = torch.randint(0, width + 1, (rows // spec.next_n,), generator=gen, device=device)
        return zeros, decode_ends(seq_lens, spec.next_n)
    if spec.windows == WindowDist.PREFIX:
        return zeros, torch.randint(0, width + 1, (rows,), generator=gen, device=device)
    starts = torch.randint(0, width + 1, (rows,), generator=gen, device=device)
    spans = (torch.rand(rows, generator=gen, device=device) * (width - starts + 1)).floor().to(i64)
    return starts, starts + spans.clamp(max=width - starts)


def _per_row(counts: tuple[int, ...], rows: int, device: str | torch.device) -> torch.Tensor:
    """int64 [rows, 1]: counts[r % len(counts)] for each row r."""
    cycle = torch.tensor(counts, dtype=torch.int64, device=device)
    return cycle[torch.arange(rows, device=device) % len(counts)][:, None]


def _drawn(spec: TopkSpec, rank: torch.Tensor, gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """float32 [rows, width] values of the spec's distribution (outside the windows too; replaced later)."""
    shape, kind = (spec.rows, spec.width), spec.values
    if kind == TopkValues.EQUAL:
        return torch.ones(shape, device=device)
    if kind == TopkValues.INTEGER:
        return torch.randint(-16, 17, shape, generator=gen, device=device).float()
    if kind == TopkValues.CROWDED:
        return 1.0 + 0.245 * torch.rand(shape, generator=gen, device=device)
    if kind == TopkValues.HEAVY:
        normal = torch.randn(shape, generator=gen, device=device)
        return torch.sign(normal) * torch.exp2(8.0 * torch.randn(shape, generator=gen, device=device))
    if kind == TopkValues.TIED:
        return _tied(spec, rank, gen, device)
    if kind == TopkValues.EXTREME:
        return _extreme(shape, gen, device)
    return torch.randn(shape, generator=gen, device=device)


def _extreme(shape: tuple[int, int], gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """Each value, with equal odds, N(0, 1) or one of EXTREMES (the first a denormal: its scale times U(0, 1)),
    of either sign; computed in float32, so the denormals are float32's own."""
    which = torch.randint(0, len(EXTREMES) + 1, shape, generator=gen, device=device)
    sign = torch.where(torch.rand(shape, generator=gen, device=device) < 0.5, -1.0, 1.0)
    fraction = torch.rand(shape, generator=gen, device=device)
    magnitudes = torch.tensor(EXTREMES, dtype=torch.float32, device=device)[(which - 1).clamp(min=0)]
    extreme = sign * torch.where(which == 1, magnitudes * fraction, magnitudes)  # which == 1: a denormal
    return torch.where(which == 0, torch.randn(shape, generator=gen, device=device), extreme)


def _tied(spec: TopkSpec, rank: torch.Tensor, gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """`above` distinct values in [2, 3) at the first ranks, `ties` values of exactly 1.0 next, the rest in
    [-1, 0): the k-th largest is a tie value exactly when above < k <= above + ties."""
    ties = _per_row(spec.ties, spec.rows, device)
    above = torch.full_like(ties, spec.k // 2) if spec.above is None else torch.full_like(ties, spec.above)
    if spec.above is None:  # straddle the k-th: k - ties <= above <= k - 1
        above = torch.minimum(torch.maximum(above, spec.k - ties), torch.full_like(ties, spec.k - 1)).clamp(min=0)
    noise = torch.rand(spec.rows, spec.width, generator=gen, device=device)
    return torch.where(rank < above, 2.0 + noise, torch.where(rank < above + ties, 1.0, noise - 1.0))


def _special(spec: TopkSpec, values: torch.Tensor, rank: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """The spec's -inf (past `finite`), NaN and +inf positions: the last ranks of each row's candidates."""
    kept = lens[:, None] if spec.finite is None else torch.minimum(_per_row(spec.finite, spec.rows, values.device),
                                                                   lens[:, None])
    values = torch.where(rank >= kept, -math.inf, values)
    values = torch.where((rank < kept) & (rank >= kept - spec.nans), math.nan, values)
    return torch.where((rank < kept - spec.nans) & (rank >= kept - spec.nans - spec.pos_infs), math.inf, values)


def _outside(spec: TopkSpec, shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    if spec.outside == Outside.NEG_INF:
        return torch.full(shape, -math.inf, device=device)
    if spec.outside == Outside.RANDOM:
        return torch.randn(shape, generator=gen, device=device)
    columns = torch.arange(shape[1], device=device, dtype=torch.float32)
    return HOSTILE * (1.0 + columns / (2.0 * shape[1])).expand(shape)


# --------------------------------------------------------------------------- which cases

class TopkFamily(str, enum.Enum):
    """A named kind of top-k edge case; a report says which families a run reached."""

    RANDOM = "random"  # ragged windows, normal values, for every k
    K_VALUES = "k-values"  # each k the contract declares (512, 1024, 2048 where it takes any)
    ALL_EQUAL = "all-equal"
    TIES_STRADDLE = "ties-straddle"  # k - 1, k, k + 1 and 3k values equal to the k-th
    # adjacent rows each with a tie at the k-th value and a surplus of it: a surplus stored into the next row shows
    TIES_ACROSS_ROWS = "ties-across-rows"
    TIES_PAST_2048 = "ties-past-2048"  # sglang#35257's capped tie list
    TIES_PAST_16384 = "ties-past-16384"  # vllm#51782's candidate buffer
    CROWDED_BIN = "crowded-bin"  # distinct values of one coarse bin past 2048, 4096 and 16384 (sglang#36807)
    FEW_CANDIDATES = "few-candidates"  # k - 1, k, k + 1 candidates in windows longer than k
    SHORT_WINDOWS = "short-windows"  # windows of 0, 1, k - 1, k, k + 1 columns
    PADDING_ORDER = "padding-order"  # rows of 0, 1, k - 1 candidates before rich rows, and after them
    SPECIAL_VALUES = "special-values"  # -inf, +inf and NaN inside windows, rows of all -inf, float32's extremes
    PREFILL_WINDOWS = "prefill-windows"  # windows starting past column 0 (vllm#56749's absolute vs relative)
    DECODE_RULE = "decode-rule"  # end = L - next_n + j + 1 for each next_n
    ODD_STRIDE = "odd-stride"  # row strides that are not multiples of 4: odd widths and padded views
    PADDED_STRIDE = "padded-stride"  # DeepGEMM's row-padded logits: stride align(width, 256)
    VALUES = "values"  # heavy-tailed and integer-exact values
    WIDE_ROWS = "wide-rows"  # 2^20 columns, and short windows in rows of >= 200000 columns (vLLM's split path)
    ROW_COUNTS = "row-counts"  # 32/33 and 64/65 rows: persistent FilteredTopK and cooperative_topk thresholds


@dataclasses.dataclass(frozen=True)
class TopkPlanned:
    """A spec and the families it reaches."""

    spec: TopkSpec
    families: tuple[TopkFamily, ...]


@dataclasses.dataclass(frozen=True)
class TopkOmission:
    """A family (or one case of it) left out, and why, with the numbers."""

    family: TopkFamily
    reason: str
    spec_name: str = ""


def default_topk_specs(ks: tuple[int, ...] = DEFAULT_KS) -> list[TopkSpec]:
    """The random suite: per k, 4 rows of 3k columns with ragged (prefill) windows of normal values, and 4
    decode rows (next_n 2) of prefix windows; the widths are multiples of 4 so every kernel takes them."""
    out = []
    for k in ks:
        out.append(TopkSpec(name=f"random-ragged-k{k}", rows=4, width=3 * k, k=k, windows=WindowDist.RAGGED))
        out.append(TopkSpec(name=f"random-decode-k{k}", rows=4, width=3 * k, k=k, windows=WindowDist.DECODE,
                            next_n=2, outside=Outside.RANDOM))
    return out


def topk_plan(contract: TopkContract, target: Target) -> list[TopkPlanned | TopkOmission]:
    """Every family for a kernel of `contract` at `target`'s scale: the specs it takes, and an omission with
    the reason for each one it does not (the contract's own reason, or the scale's)."""
    ks = _ks(contract)
    out: list[TopkPlanned | TopkOmission] = []
    for planned in _families(ks, target.scale == Scale.SMALL, contract):
        if isinstance(planned, TopkOmission):
            out.append(planned)
            continue
        reason = _refused(contract, planned.spec)
        out.append(planned if reason is None else TopkOmission(planned.families[0], reason, planned.spec.name))
    return out


def _ks(contract: TopkContract) -> tuple[int, ...]:
    """The k values to draw: the contract's, else the field's (up to its max_k, else max_k itself)."""
    if contract.ks is not None:
        return tuple(sorted(contract.ks))
    most = contract.max_k or max(DEFAULT_KS)
    return tuple(k for k in DEFAULT_KS if k <= most) or (most,)


def _refused(contract: TopkContract, spec: TopkSpec) -> str | None:
    """Why the contract cannot take cases of `spec` (shapes, strides, window form), or None."""
    reason = contract.shape_reason(spec.rows, spec.width, spec.stride, spec.k)
    if reason:
        return reason
    starts_past_zero = spec.windows == WindowDist.RAGGED or (spec.starts is not None and any(spec.starts))
    if contract.window in (WindowForm.LENGTHS, WindowForm.DECODE_RULE) and starts_past_zero:
        return f"windows start past column 0 and the contract's window form {contract.window.value} has no starts"
    decode = spec.windows == WindowDist.DECODE and spec.starts is None
    if contract.window == WindowForm.DECODE_RULE and spec.next_n > 1 and not decode:
        return f"the windows of next_n={spec.next_n} are not drawn by the decode rule the contract's window form needs"
    if decode and contract.next_n is not None and spec.next_n not in contract.next_n:
        return f"contract next_n {list(contract.next_n)} exclude {spec.next_n}"
    return None


def _families(ks: tuple[int, ...], small: bool, contract: TopkContract) -> list[TopkPlanned | TopkOmission]:
    k = ks[0]  # the smallest k stands for the families that are about values, not about k
    base = TopkSpec(rows=4, width=3 * k, k=k, windows=_base_windows(contract))
    return [*_randoms(ks, base), *_ties(base, max(ks)), *_counts(base), *_shapes(base, contract), *_wide(base, small)]


def _base_windows(contract: TopkContract) -> WindowDist:
    """Full rows for kernels told lengths or the decode rule (no starts), ragged windows otherwise."""
    return {WindowForm.LENGTHS: WindowDist.PREFIX, WindowForm.DECODE_RULE: WindowDist.DECODE}.get(
        contract.window, WindowDist.RAGGED)


def _randoms(ks: tuple[int, ...], base: TopkSpec) -> list[TopkPlanned | TopkOmission]:
    """RANDOM and K_VALUES: the base's windows over 3k columns for every k; heavy-tailed and integer values."""
    out: list[TopkPlanned | TopkOmission] = [
        TopkPlanned(base.replace(name=f"random-k{k}", k=k, width=3 * k), (TopkFamily.RANDOM, TopkFamily.K_VALUES))
        for k in ks]
    for name, values in (("heavy-tailed-values", TopkValues.HEAVY), ("integer-exact", TopkValues.INTEGER)):
        out.append(TopkPlanned(base.replace(name=name, values=values), (TopkFamily.VALUES,)))
    out.append(TopkPlanned(base.replace(name="all-equal", values=TopkValues.EQUAL), (TopkFamily.ALL_EQUAL,)))
    return out


def _ties(base: TopkSpec, k_top: int) -> list[TopkPlanned | TopkOmission]:
    """TIES_STRADDLE, TIES_ACROSS_ROWS, TIES_PAST_2048/16384 and CROWDED_BIN: exact ties around the k-th value,
    at the smallest k in four rows (k - 1, k, k + 1 and 3k equal values, above = k // 2 of them greater); four
    rows each with k // 2 greater values and a surplus of ties past the k-th (a kernel storing one row's surplus
    into the next row's slots meets a row whose own ties it must keep apart from the spilled ones); then at
    the largest k one row of 2049 and one of 16385 ties; crowded rows of one coarse bin holding 2049, 4097
    and 16385 distinct values, full windows."""
    k = base.k
    straddle = base.replace(name="ties-straddle", values=TopkValues.TIED, ties=(k - 1, k, k + 1, 3 * k),
                            windows=WindowDist.FULL, width=5 * k)
    # Surpluses of k // 2 + 1, 1, k + 1 and 1 tie values: each row's k-th is a tie, and so is its neighbours'.
    across = base.replace(name="ties-across-rows", values=TopkValues.TIED, above=k // 2,
                          ties=(k + 1, k - k // 2 + 1, 2 * k - k // 2 + 1, k - k // 2 + 1), windows=WindowDist.FULL,
                          width=3 * k)
    out: list[TopkPlanned | TopkOmission] = [TopkPlanned(straddle, (TopkFamily.TIES_STRADDLE,)),
                                             TopkPlanned(across, (TopkFamily.TIES_ACROSS_ROWS,))]
    for count, family in ((2049, TopkFamily.TIES_PAST_2048), (16385, TopkFamily.TIES_PAST_16384)):
        width = _round4(k_top // 2 + count + k_top)
        out.append(TopkPlanned(base.replace(name=f"ties-{count}", rows=1, k=k_top, width=width, ties=(count,),
                                            values=TopkValues.TIED, windows=WindowDist.FULL), (family,)))
    for count in (2049, 4097, 16385):
        out.append(TopkPlanned(base.replace(name=f"crowded-bin-{count}", rows=1, k=k_top, width=_round4(count),
                                            ends=(count,), starts=(0,), values=TopkValues.CROWDED),
                               (TopkFamily.CROWDED_BIN,)))
    return out


def _counts(base: TopkSpec) -> list[TopkPlanned | TopkOmission]:
    """FEW_CANDIDATES, SHORT_WINDOWS, PADDING_ORDER, SPECIAL_VALUES: k - 1, k, k + 1 candidates in windows of 2k
    of the 3k columns (the rest of the window -inf, so a kernel padding past the window must pick -inf positions
    inside it and not the -inf it masks outside); windows of 0, 1, k - 1, k, k + 1 columns; rows of 0, 1 and
    k - 1 candidates before three full rows, and after them (a count or a pad carried from one row to the next
    shows whichever way it runs); rows with -inf, +inf and NaN inside their windows."""
    k = base.k
    few = base.replace(name="few-candidates", rows=3, starts=(0,) * 3, ends=(2 * k,) * 3, finite=(k - 1, k, k + 1))
    lengths = (0, 1, k - 1, k, k + 1)
    short = base.replace(name="short-windows", rows=len(lengths), starts=(0,) * len(lengths), ends=lengths)
    poor, rich = (0, 1, k - 1), (3 * k,) * 3
    return [TopkPlanned(few, (TopkFamily.FEW_CANDIDATES,)), TopkPlanned(short, (TopkFamily.SHORT_WINDOWS,)),
            TopkPlanned(base.replace(name="padding-rows-first", rows=6, windows=WindowDist.FULL, finite=poor + rich),
                        (TopkFamily.PADDING_ORDER,)),
            TopkPlanned(base.replace(name="padding-rows-last", rows=6, windows=WindowDist.FULL, finite=rich + poor),
                        (TopkFamily.PADDING_ORDER,)),
            *_special_values(base)]


def _special_values(base: TopkSpec) -> list[TopkPlanned | TopkOmission]:
    """SPECIAL_VALUES, full windows: -inf and 3 +inf; k + 1 +inf (the k-th value a tie of +inf); rows of all -inf
    beside rich ones; 2 NaN; float32's extremes (denormals, -0.0, the largest finite)."""
    k = base.k
    specs = (base.replace(name="neg-inf-and-pos-inf", finite=(2 * k,), pos_infs=3),
             base.replace(name="pos-inf-past-k", pos_infs=k + 1),
             base.replace(name="all-neg-inf-rows", finite=(0, 3 * k)),
             base.replace(name="nan-inside", nans=2),
             base.replace(name="extreme-values", values=TopkValues.EXTREME))
    return [TopkPlanned(spec.replace(windows=WindowDist.FULL), (TopkFamily.SPECIAL_VALUES,)) for spec in specs]


def _shapes(base: TopkSpec, contract: TopkContract) -> list[TopkPlanned | TopkOmission]:
    """PREFILL_WINDOWS, DECODE_RULE, ODD_STRIDE, PADDED_STRIDE: windows starting past 0; the decode rule at
    every next_n the contract takes (1-4 where any); odd widths, odd padded strides and DeepGEMM's
    align(width, 256) padding."""
    width = base.width
    out: list[TopkPlanned | TopkOmission] = [
        TopkPlanned(base.replace(name="prefill-windows", windows=WindowDist.RAGGED, outside=Outside.HOSTILE),
                    (TopkFamily.PREFILL_WINDOWS,))]
    for next_n in contract.next_n or (1, 2, 3, 4):
        out.append(TopkPlanned(base.replace(name=f"decode-mtp{next_n}", rows=2 * next_n, next_n=next_n,
                                            windows=WindowDist.DECODE), (TopkFamily.DECODE_RULE,)))
    strides = [TopkPlanned(base.replace(name="odd-width", width=width + 1), (TopkFamily.ODD_STRIDE,)),
               TopkPlanned(base.replace(name="odd-padded-stride", row_stride=width + 3), (TopkFamily.ODD_STRIDE,)),
               TopkPlanned(base.replace(name="padded-stride-256", width=width - 1, row_stride=_align(width - 1, 256)),
                           (TopkFamily.PADDED_STRIDE,))]
    return [*out, *strides]


def _wide(base: TopkSpec, small: bool) -> list[TopkPlanned | TopkOmission]:
    """WIDE_ROWS and ROW_COUNTS, production scale only: 4 rows of 2^20 columns; 4 short windows (k - 1 .. 2k)
    in rows of 262144 columns; 33 and 65 rows of 16385-column windows of crowded values (vllm#51782)."""
    k = base.k
    if small:
        return [TopkOmission(TopkFamily.WIDE_ROWS, "rows of 2^20 columns: 4 rows x 2^20 float32 = 16 MiB, and "
                                                   "the CPU's interpreted kernels read every column; production "
                                                   "scale only"),
                TopkOmission(TopkFamily.ROW_COUNTS, "33 and 65 rows of 16385 columns: thresholds of GPU schedules "
                                                    "(FilteredTopK past 32 rows, cooperative_topk up to 64); "
                                                    "production scale only")]
    out: list[TopkPlanned | TopkOmission] = [
        TopkPlanned(base.replace(name="width-2^20", width=1 << 20, windows=WindowDist.PREFIX), (TopkFamily.WIDE_ROWS,)),
        TopkPlanned(base.replace(name="short-in-wide-rows", width=262144, rows=4, starts=(0,) * 4,
                                 ends=(k - 1, k, k + 1, 2 * k)), (TopkFamily.WIDE_ROWS,))]
    for rows in (33, 65):
        spec = base.replace(name=f"rows-{rows}-crowded", rows=rows, width=16388, windows=WindowDist.FULL,
                            values=TopkValues.CROWDED)
        out.append(TopkPlanned(spec, (TopkFamily.ROW_COUNTS, TopkFamily.CROWDED_BIN)))
    return out


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def _align(n: int, to: int) -> int:
    return -(-n // to) * to
