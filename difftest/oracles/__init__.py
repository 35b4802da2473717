"""Torch references for the kernels difftest checks."""

from difftest.oracles.paged_mqa_logits import fp32_error_bound, paged_mqa_logits, reference

__all__ = ["fp32_error_bound", "paged_mqa_logits", "reference"]
