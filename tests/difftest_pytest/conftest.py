"""Plugin tests run pytest on generated files (pytester); planted.py is the planted-bug backends module."""

from __future__ import annotations

from pathlib import Path

import pytest

# In-process pytester runs restore sys.modules afterwards: what registers native operators (torch,
# and torch._dynamo, which the guards' dispatch mode imports on first use) must be imported here,
# before any of them, or the next run would import it a second time and fail to register.
import torch._dynamo  # noqa: F401

import difftest.workflows.checking  # noqa: F401

PLANTED_SOURCE = Path(__file__).with_name("planted_backends.py").read_text()


@pytest.fixture
def planted(pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester with `planted` (planted_backends.py: off_by_one, cuda_only) importable from its directory."""
    pytester.makepyfile(planted=PLANTED_SOURCE)
    pytester.syspathinsert()
    return pytester
