"""myindexer: the logits of a DeepSeek-V3.2-style sparse-attention indexer over a paged fp8 key cache."""

from myindexer.kernel import paged_mqa_logits

__all__ = ["paged_mqa_logits"]
__version__ = "0.1.0"
