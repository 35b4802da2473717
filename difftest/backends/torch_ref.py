"""`torch`: the oracle run as a backend. It decodes the bytes it is handed, so it checks the encoders."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from difftest.backends.base import Backend
from difftest.core import hardware
from difftest.core.contract import Contract
from difftest.core.fp8 import decode
from difftest.core.kernel_inputs import KernelInputs, decode_row_lens
from difftest.core.kinds import CacheLayout, LengthEncoding, MaskConvention
from difftest.core.layout import unpack_cache
from difftest.oracles.paged_mqa_logits import paged_mqa_logits


class TorchBackend:
    """Reads per-row lengths and block-split bytes like DeepGEMM; computes in float64 on the CPU.

    Its envelope is unbounded (every envelope field None, no tiles, no partition): plain torch on
    whatever shape it is handed.
    """

    name = "torch"
    contract = Contract(length_encoding=LengthEncoding.PER_ROW, cache_layout=CacheLayout.BLOCK_SPLIT,
                        mask=MaskConvention.TAIL_NEG_INF, rtol=1e-9,
                        library=f"torch {torch.__version__}", batchable=True)

    def unavailable_reason(self, device: str) -> str | None:
        """None on the CPU; on "cuda", why torch sees no GPU."""
        return hardware.cuda_unavailable_reason() if device == "cuda" else None

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The oracle on the decoded inputs: float64 on the CPU, float32 on a GPU."""
        return self.logits(inputs)

    def logits(self, inputs: KernelInputs, positions: int | None = None) -> torch.Tensor:
        """The call, over `positions` keys of every row (None: the longest row's, read on the host)."""
        dtype = torch.float64 if inputs.q.device.type == "cpu" else torch.float32
        batch, next_n, _, head_dim = inputs.q.shape
        k_pool, scales = unpack_cache(inputs.kv_cache, head_dim, inputs.layout)
        q = inputs.q.view(torch.uint8)
        return paged_mqa_logits(decode(q, inputs.fp8, dtype), decode(k_pool, inputs.fp8, dtype), scales,
                                inputs.weights, _row_block_table(inputs),
                                decode_row_lens(inputs, batch, next_n), inputs.max_model_len, positions)

    def prepare(self, inputs: KernelInputs, out: torch.Tensor | None) -> Callable[[], torch.Tensor]:
        """The whole call: nothing of it is per batch (Preparable). On a GPU it computes every position the
        block table holds, so it reads no length on the host and a CUDA graph captures it (difftest run --graph)."""
        if inputs.q.device.type != "cuda":
            return functools.partial(self, inputs, out)
        return functools.partial(self.logits, inputs, _row_block_table(inputs).shape[1] * inputs.block_size)


def _row_block_table(inputs: KernelInputs) -> torch.Tensor:
    """One block-table row per q row: the request's row under FLATTENED_INDICES, and under
    PREFIX_SUM each sequence's slice of the flat token ids (block_size 1), padded with slot 0."""
    table = inputs.block_table
    if inputs.encoding == LengthEncoding.FLATTENED_INDICES:
        return table[inputs.indices.long()]
    if inputs.encoding != LengthEncoding.PREFIX_SUM:
        return table
    prefix = inputs.context_lens.to(torch.int64)
    lens = prefix[1:] - prefix[:-1]
    positions = torch.arange(max(int(lens.max()) if lens.numel() else 0, 1), device=table.device)
    flat = prefix[:-1, None] + positions
    inside = positions < lens[:, None]
    if table.numel() == 0:
        return torch.zeros(flat.shape, dtype=table.dtype, device=table.device)
    return torch.where(inside, table[flat.clamp(max=table.numel() - 1)], 0)


BACKENDS: dict[str, Callable[[], Backend]] = {"torch": TorchBackend}
