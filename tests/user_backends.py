"""User backends for the runner and CLI tests: `--backend-module tests.user_backends:<name>`.

Each computes with the oracle's own formula on what it is handed, so only the way it reads the
lengths (or fails to write) differs from the truth; the expected verdicts follow from that alone.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable

import torch

from difftest.backends.user import backend
from difftest.core.contract import Contract
from difftest.core.fp8 import decode
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention
from difftest.core.layout import unpack_cache
from difftest.oracles.paged_mqa_logits import paged_mqa_logits

PER_SEQUENCE = Contract(LengthEncoding.PER_SEQUENCE, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF,
                        rtol=1e-9, library="tests")
PER_ROW = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF,
                   rtol=1e-9, library="tests")


def logits_with_limits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, row_lens: torch.Tensor,
                       block_table: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """The formula on block-split e4m3fn inputs, with whatever (B, next_n) limits the caller derived."""
    k_pool, scales = unpack_cache(kv_cache, q.shape[-1], CacheLayout.BLOCK_SPLIT)
    flavour = Fp8Flavour.E4M3FN
    return paged_mqa_logits(decode(q.view(torch.uint8), flavour), decode(k_pool, flavour), scales, weights,
                            block_table, row_lens.long(), max_model_len)


def per_sequence_limits(seq_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """What a per-sequence kernel derives itself: max(L - next_n + j + 1, 0)."""
    return (seq_lens.long()[:, None] + torch.arange(next_n) - next_n + 1).clamp(min=0)


@backend(contract=PER_SEQUENCE)
def per_sequence_reader(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right under its contract. Like AITER it reads context_lens[b] from a flat pointer, so a
    (B, next_n) table handed to it is misread as its first B entries (vllm#59420)."""
    batch, next_n = q.shape[:2]
    seq_lens = context_lens.reshape(-1)[:batch]
    return logits_with_limits(q, kv_cache, weights, per_sequence_limits(seq_lens, next_n), block_table,
                              max_model_len)


@backend(contract=PER_SEQUENCE)
def sequence_length_for_every_row(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Mutant: every row of sequence b sees L_b keys, the MTP offset L - next_n + j + 1 forgotten."""
    batch, next_n = q.shape[:2]
    rows = context_lens.long()[:, None].expand(batch, next_n)
    return logits_with_limits(q, kv_cache, weights, rows, block_table, max_model_len)


@backend(contract=PER_SEQUENCE, name="mirrored-mtp-window")
def mirrored_mtp_window(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Mutant: AITER 0.1.7's window (docs/findings/aiter-triton-mask.md): row j sees p <= L - j, so
    row j behaves as row next_n - j, and row 0's extra position p = L holds the phantom 0.0."""
    batch, next_n = q.shape[:2]
    seq_lens = context_lens.long()[:batch]
    mirrored = (seq_lens[:, None] - torch.arange(next_n, device=q.device) + 1).clamp(min=0, max=max_model_len)
    logits = logits_with_limits(q, kv_cache, weights, torch.minimum(mirrored, seq_lens[:, None]), block_table,
                                max_model_len)
    phantom = mirrored.reshape(-1) > seq_lens.repeat_interleave(next_n)  # only row 0, only where p = L fits
    rows = torch.nonzero(phantom).flatten()
    logits[rows, seq_lens.repeat_interleave(next_n)[rows]] = 0.0
    return logits


@backend(contract=PER_ROW, name="window-one-short")
def window_one_short(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Mutant: off by one at the window end (the last visible key dropped)."""
    rows = (context_lens.long() - 1).clamp(min=0)
    return logits_with_limits(q, kv_cache, weights, rows, block_table, max_model_len)


# A kernel whose table loads cover 16 columns (256 tokens at block 16) and which declares the longest
# context it takes: the CPU's toy contexts (128 and 256) never pass the 16th column, its envelope does.
WITHIN_1024 = dataclasses.replace(PER_ROW, block_sizes=(16,), max_context=1024)


@backend(contract=WITHIN_1024, name="wrong-past-16-columns")
def wrong_past_16_columns(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Mutant: keys past the 16th block-table column never scored (-inf), right below it."""
    limits = context_lens.long().clamp(max=16 * kv_cache.shape[1])
    return logits_with_limits(q, kv_cache, weights, limits, block_table, max_model_len)


@backend(contract=PER_ROW)
def raises(q, kv_cache, weights, context_lens, block_table, max_model_len):
    raise RuntimeError("kernel exploded at launch")


@backend(contract=PER_ROW)
def wrong_shape(q, kv_cache, weights, context_lens, block_table, max_model_len):
    return torch.zeros(weights.shape[0], max_model_len + 1)


class LeavesLastRowUnwritten:
    """Fills the engine's poisoned buffer like a kernel that never launches the last row's block."""

    name = "leaves-last-row-unwritten"
    contract = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF,
                        writes_into_output=True, output_dtype=torch.float32)

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        assert out is not None, "writes_into_output promises a buffer"
        full = logits_with_limits(inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                                  inputs.block_table, inputs.max_model_len)
        out[:-1] = full[:-1].to(out.dtype)
        return out


class DeclaresCudaOnly:
    """Available everywhere by its own account, but its contract lists only CUDA."""

    name = "cuda-only"
    contract = Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF,
                        devices=("cuda",))

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        raise AssertionError("must never be called on the CPU")


class PreparesOnce:
    """Right; declares prepare() (difftest.backends.base.Preparable): a slow per-batch set-up, SETUP
    seconds as a schedule build might take, then a fast per-layer call. `set_ups` counts the set-ups."""

    name = "prepares-once"
    contract = PER_ROW
    SETUP = 0.2

    def __init__(self) -> None:
        self.set_ups = 0

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        return self.prepare(inputs, out)()

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        time.sleep(self.SETUP)
        self.set_ups += 1
        return functools.partial(logits_with_limits, inputs.q, inputs.kv_cache, inputs.weights, inputs.context_lens,
                                 inputs.block_table, inputs.max_model_len)


def make_per_sequence_reader():
    """A factory: `--backend-module tests.user_backends:make_per_sequence_reader`."""
    from difftest.backends.user import FunctionBackend

    return FunctionBackend.from_function(per_sequence_reader)


CALL_LOG = "DIFFTEST_TEST_CALL_LOG"  # where the recording backends append "name start end" per call


def _recorded(name: str, q, kv_cache, weights, context_lens, block_table, max_model_len) -> torch.Tensor:
    start = time.time()
    time.sleep(0.5)  # long enough that two calls in flight at once must overlap
    logits = logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
    with open(os.environ[CALL_LOG], "a") as log:
        log.write(f"{name} {start} {time.time()}\n")
    return logits


@backend(contract=PER_ROW, name="recorded-a")
def recorded_a(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right; records when its call ran (CALL_LOG)."""
    return _recorded("recorded-a", q, kv_cache, weights, context_lens, block_table, max_model_len)


@backend(contract=PER_ROW, name="recorded-b")
def recorded_b(q, kv_cache, weights, context_lens, block_table, max_model_len):
    """Right; records when its call ran (CALL_LOG)."""
    return _recorded("recorded-b", q, kv_cache, weights, context_lens, block_table, max_model_len)
