"""Planted ragged logits bugs: backends right except for one thing, each the shape of a bug the field has had or
invites, and the family of difftest.generators.ragged that reaches it (PLANTED: backend, family spec, verdict).

Each computes the float64 oracle's logits (difftest.oracles.ragged_mqa_logits) from what it is handed, in its
contract's form, and breaks one thing. Their contracts declare a 64-key tile, so the planner's tile families
are theirs.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from difftest.core.kinds import LogitsForm, MaskConvention
from difftest.core.ragged import RaggedContract, RaggedInputs, RaggedTiles
from difftest.core.verdict import Verdict
from difftest.oracles.ragged_mqa_logits import absolute, ragged_mqa_logits

TILE = 64
_ANY = dict(devices=("cpu",), tiles=RaggedTiles(kv=(TILE,)), library="tests.planted_ragged")
ABSOLUTE_CLEAN = RaggedContract(LogitsForm.ABSOLUTE, MaskConvention.TAIL_NEG_INF, **_ANY)
RELATIVE_CLEAN = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_NEG_INF, **_ANY)
RELATIVE_UNCLEANED = RaggedContract(LogitsForm.WINDOW_RELATIVE, MaskConvention.TAIL_UNSPECIFIED, **_ANY)
WRAP_BYTES = 2 ** 31  # an int32 byte offset of key index * D wraps here
SATURATION = 32.0  # |logit| the saturating backend stores at most: the random suite's rows reach 8 to 41


def logits_of(inputs: RaggedInputs, k_start: torch.Tensor, k_end: torch.Tensor, width: int,
              keys: torch.Tensor | None = None) -> torch.Tensor:
    """float64 window-relative logits of windows [k_start, k_end) at `width` columns (keys: the buffer read)."""
    q = inputs.q.to(torch.float64)
    return ragged_mqa_logits(q, inputs.k if keys is None else keys, inputs.k_scale, inputs.weights,
                             k_start.long(), k_end.long(), width)


def in_form(inputs: RaggedInputs, relative: torch.Tensor, k_start: torch.Tensor) -> torch.Tensor:
    """float32 logits in the inputs' form from window-relative ones whose column j is key k_start + j."""
    if inputs.form == LogitsForm.ABSOLUTE:
        return absolute(relative, k_start.long(), inputs.keys).float()
    return relative.float()


def wrapped_keys(keys: int, head_dim: int, wrap_bytes: int) -> torch.Tensor:
    """int64 [keys]: the key a kernel reads for key p when its byte offset p * D is an integer that wraps at
    `wrap_bytes` (an int32 product wraps at 2^31)."""
    return (torch.arange(keys, dtype=torch.int64) * head_dim % wrap_bytes) // head_dim


@dataclasses.dataclass
class Planted:
    """A planted backend: `name`, its contract, the bug applied (a method `_<bug>`), and for the offset bug
    the byte count its int32 offsets wrap at."""

    name: str
    bug: str
    contract: RaggedContract = ABSOLUTE_CLEAN
    wrap_bytes: int = WRAP_BYTES

    def unavailable_reason(self, device: str) -> str | None:
        """CPU only."""
        return None if device == "cpu" else "planted bugs run on the CPU"

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The right logits with this backend's bug planted in them."""
        return getattr(self, f"_{self.bug}")(inputs, out)

    def _right(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Right: the oracle's logits rounded to float32 (must PASS everywhere)."""
        return in_form(inputs, logits_of(inputs, inputs.k_start, inputs.k_end, inputs.width), inputs.k_start)

    def _tile_end(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """A window of a whole number of tiles loses its last key (a `<` for `<=` in the last tile's mask):
        -inf inside, FAIL(mask) on the tile-ends family."""
        lens = inputs.k_end - inputs.k_start
        ends = torch.where((lens > 0) & (lens % TILE == 0), inputs.k_end - 1, inputs.k_end)
        return in_form(inputs, logits_of(inputs, inputs.k_start, ends, inputs.width), inputs.k_start)

    def _ks_ignored(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Every window read from key 0 (k_start dropped): finite values before the window, FAIL(mask) where a
        request starts past key 0."""
        zeros = torch.zeros_like(inputs.k_start)
        return in_form(inputs, logits_of(inputs, zeros, inputs.k_end, inputs.keys), zeros)

    def _per_request(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Each row takes its request's window (the longest end among the rows sharing its k_start) instead of
        its own causal one: finite values past the row's end, FAIL(mask) on the staircase."""
        starts = inputs.k_start.long()
        longest = torch.zeros(inputs.keys + 1, dtype=torch.int64).scatter_reduce(0, starts, inputs.k_end.long(),
                                                                                 "amax")
        return in_form(inputs, logits_of(inputs, starts, longest[starts], inputs.width), starts)

    def _spill(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Whole tiles stored into unpadded rows of max_seqlen_k columns, rows written last to first: a window
        whose last tile passes max_seqlen_k overwrites the next row's first columns with its keys past k_end
        (DeepGEMM 2.8's unbounded store, without its padding): FAIL(value) in the next row."""
        width, starts = inputs.width, inputs.k_start.long()
        tiled = (inputs.k_end.long() - starts + TILE - 1) // TILE * TILE
        reach = int(tiled.max()) if len(tiled) else 0
        values = logits_of(inputs, starts, torch.minimum(starts + tiled, torch.tensor(inputs.keys)), max(reach, 1))
        values = values.masked_fill(torch.isneginf(values), 0.0)  # keys past the buffer read as zeros (TMA's fill)
        flat = torch.full((inputs.rows * width + reach,), -math.inf, dtype=torch.float64)
        for row in reversed(range(inputs.rows)):
            stored = int(tiled[row])
            flat[row * width:row * width + stored] = values[row, :stored]
        return flat[:inputs.rows * width].view(inputs.rows, width).float()

    def _int32_offset(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Key p read at byte offset p * D computed in an integer that wraps at `wrap_bytes` (int32: 2^31): keys
        past the wrap are read from the buffer's start, FAIL(value) where a window holds one."""
        keys = inputs.k.to(torch.float64)[wrapped_keys(inputs.keys, inputs.k.shape[1], self.wrap_bytes)]
        return in_form(inputs, logits_of(inputs, inputs.k_start, inputs.k_end, inputs.width, keys), inputs.k_start)

    def _uncleaned(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The tail past each window left at 0.0 under a contract that promises -inf there: FAIL(mask) wherever a
        window is shorter than max_seqlen_k."""
        relative = logits_of(inputs, inputs.k_start, inputs.k_end, inputs.width)
        return in_form(inputs, relative.masked_fill(torch.isneginf(relative), 0.0), inputs.k_start)

    def _nan_read(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The last position of each window scored with the key after it (an off-by-one read): NaN where that
        key is a canary no window holds, FAIL(nan)."""
        starts, ends = inputs.k_start.long(), inputs.k_end.long()
        relative = logits_of(inputs, starts, ends, inputs.width)
        rows = torch.nonzero((ends > starts) & (ends < inputs.keys)).flatten()
        if len(rows):
            key = ends[rows]
            dots = torch.einsum("mhd,md->mh", inputs.q.to(torch.float64)[rows], inputs.k.to(torch.float64)[key])
            wrong = (dots.relu() * inputs.weights.double()[rows]).sum(dim=1) * inputs.k_scale.double()[key]
            relative[rows, (ends - starts)[rows] - 1] = wrong
        return in_form(inputs, relative, starts)

    def _saturated(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Finite logits clamped to +-SATURATION (a saturating store sized for smaller scores): FAIL(value) where a
        row passes it (random-full), and q doubled pushes every logit past SATURATION / 2 against it."""
        relative = logits_of(inputs, inputs.k_start, inputs.k_end, inputs.width)
        clamped = torch.where(torch.isfinite(relative), relative.clamp(-SATURATION, SATURATION), relative)
        return in_form(inputs, clamped, inputs.k_start)

    def _unwritten(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Stores begin at k_start rounded up to a multiple of 4 (the start alignment applied the wrong way): the
        first positions of a window starting off a multiple of 4 keep the buffer's poison, FAIL(unwritten)."""
        assert out is not None, "writes_into_output: the engine passes a poisoned buffer"
        relative = logits_of(inputs, inputs.k_start, inputs.k_end, inputs.width).float()
        skipped = (-inputs.k_start.long()) % 4
        written = torch.arange(inputs.width)[None, :] >= skipped[:, None]
        out[written] = relative[written]
        return out


# (backend, the family spec of difftest.generators.ragged.ragged_plan that reaches it, the verdict it shows)
PLANTED: tuple[tuple[Planted, str, Verdict], ...] = (
    (Planted("planted-tile-end", "tile_end"), "tile-64-ends", Verdict.FAIL_MASK),
    (Planted("planted-ks-ignored", "ks_ignored"), "chunked-prefill", Verdict.FAIL_MASK),
    (Planted("planted-per-request", "per_request"), "chunked-prefill", Verdict.FAIL_MASK),
    (Planted("planted-spill", "spill", RELATIVE_UNCLEANED), "tile-64-ends", Verdict.FAIL_VALUE),
    # The int32 offset wraps at 2^31 bytes: production scale only (tests check the plan); this copy wraps at
    # 2^14 bytes, which the 300-key cases of the random suite pass at D 64.
    (Planted("planted-offset-wrap-2^14", "int32_offset", wrap_bytes=2 ** 14), "random-staircase", Verdict.FAIL_VALUE),
    (Planted("planted-uncleaned", "uncleaned", RELATIVE_CLEAN), "chunked-prefill", Verdict.FAIL_MASK),
    (Planted("planted-nan-read", "nan_read"), "disjoint-blocks", Verdict.FAIL_NAN),
    (Planted("planted-unwritten", "unwritten", dataclasses.replace(RELATIVE_UNCLEANED, writes_into_output=True)),
     "ks-unaligned", Verdict.FAIL_UNWRITTEN),
    (Planted("planted-right", "right"), "chunked-prefill", Verdict.PASS),
)
