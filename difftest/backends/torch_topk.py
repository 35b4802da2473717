"""torch.topk as the serving engines' reference top-k paths call it (no kernel library: plain torch).

* `torch-topk`: SGLang 0.5.23's `_topk_unfused` (sglang/srt/layers/attention/dsa/dsa_topk_backend.py:272-309,
  its `torch` DSA top-k backend, called with `topk_op=torch.topk, topk_op_kwargs={"dim": -1}`): mask the
  columns outside [row_start, row_start + length) with -inf, torch.topk(masked, min(k, width)), subtract
  row_start, and -1 wherever the selected score is -inf. The reference implementation many callers copy.
* `torch-topk-vllm`: vLLM 0.33.0's opt-in `torch` decode top-k (vllm/model_executor/layers/indexer_topk.py:
  359-373, "Debug reference"): row ends from seq_lens by the decode rule (`_row_ends`, :276-300), -inf past
  each row's end, torch.topk(masked, k) over the whole row, and -1 in the slots j >= row_end.

The two differ where the window holds fewer than k candidates: SGLang's pads past the candidates, vLLM's
past the window length (a -inf position inside the window is returned as a real index).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from difftest.backends.topk_base import TopkBackend
from difftest.core import hardware
from difftest.core.kinds import IndexConvention, NanRanking, TopkPadding, WindowForm
from difftest.core.topk import TopkContract, TopkInputs, decode_ends

LIBRARY = f"torch {torch.__version__}"


class TorchTopk:
    """SGLang's `_topk_unfused` with torch.topk: row-relative indices, -1 wherever the selected score is -inf.

    torch.topk returns its values sorted (descending, NaN first: torch ranks NaN above everything), so the
    order is promised; its k is min(k, width), so any width is taken."""

    name = "torch-topk"
    contract = TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_CANDIDATES,
                            window=WindowForm.STARTS_LENGTHS, sorted=True, nan=NanRanking.HIGHEST, library=LIBRARY)

    def unavailable_reason(self, device: str) -> str | None:
        """None on the CPU; on "cuda", why torch sees no GPU."""
        return hardware.cuda_unavailable_reason() if device == "cuda" else None

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k], as `_topk_unfused` computes it."""
        score, k = inputs.logits, inputs.k
        rows, width = score.shape
        indices = score.new_full((rows, k), -1, dtype=torch.int32)
        if rows == 0 or width == 0:
            return indices
        starts = inputs.row_starts.to(torch.int32)[:, None]
        ends = starts + inputs.lengths.to(torch.int32)[:, None]
        columns = torch.arange(width, dtype=torch.int32, device=score.device)[None, :]
        masked = score.masked_fill(~((columns >= starts) & (columns < ends)), -math.inf)
        valid = min(k, width)
        values, picked = torch.topk(masked, valid, dim=-1)
        indices[:, :valid] = (picked.to(torch.int32) - starts).masked_fill(values == -math.inf, -1)
        return indices


class VllmTorchTopk:
    """vLLM's `torch` decode top-k: -1 only past each row's end, so -inf positions inside a window shorter
    than k are returned; torch.topk(masked, k) over the whole row needs width >= k."""

    name = "torch-topk-vllm"
    contract = TopkContract(index=IndexConvention.ROW_RELATIVE, padding=TopkPadding.PAST_WINDOW,
                            window=WindowForm.DECODE_RULE, width_at_least_k=True, sorted=True,
                            nan=NanRanking.HIGHEST, library=LIBRARY)

    def unavailable_reason(self, device: str) -> str | None:
        """None on the CPU; on "cuda", why torch sees no GPU."""
        return hardware.cuda_unavailable_reason() if device == "cuda" else None

    def __call__(self, inputs: TopkInputs, out: torch.Tensor | None) -> torch.Tensor:
        """int32 [rows, k], as SparseIndexerTopk.forward's torch branch computes it."""
        logits, k = inputs.logits, inputs.k
        row_ends = decode_ends(inputs.seq_lens, inputs.next_n).to(torch.int32)
        cols = torch.arange(logits.shape[1], device=logits.device)
        masked = logits.masked_fill(cols.unsqueeze(0) >= row_ends.unsqueeze(1), float("-inf"))
        indices = masked.topk(k, dim=-1).indices
        in_range = torch.arange(k, device=logits.device).unsqueeze(0) < row_ends.unsqueeze(1)
        return torch.where(in_range, indices, -1).to(torch.int32)


TOPK_BACKENDS: dict[str, Callable[[], TopkBackend]] = {"torch-topk": TorchTopk, "torch-topk-vllm": VllmTorchTopk}
