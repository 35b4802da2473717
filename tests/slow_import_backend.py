"""A backend whose module takes IMPORT_SECONDS to import (a JIT library compiling at import): a
worker's start-up timeout, not the run, must give up on it."""

from __future__ import annotations

import time

from difftest.backends.user import backend
from tests.broken_backends import CONTRACT, logits_with_limits

IMPORT_SECONDS = 60
time.sleep(IMPORT_SECONDS)


@backend(contract=CONTRACT, name="slow-import")
def slow_import(q, kv_cache, weights, context_lens, block_table, max_model_len):
    return logits_with_limits(q, kv_cache, weights, context_lens, block_table, max_model_len)
