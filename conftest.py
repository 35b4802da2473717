"""Repository-root pytest configuration: the import path and the hypothesis profiles.

The root is put on sys.path so `import difftest` (and `tests.user_backends` for the CLI's
--backend-module) works from a plain checkout; with `pip install -e .` it is the same directory.

Hypothesis profiles: HYPOTHESIS_PROFILE names one explicitly; otherwise `difftest-ci` when the CI
environment variable is set, else `difftest-dev` (hypothesis' defaults without the deadline, which
a first torch call can blow on a loaded machine). `difftest-nightly` draws many more examples.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from difftest.generators.profiles import register_profiles  # noqa: E402 - needs the root on sys.path

register_profiles()


def hypothesis_profile(environ: Mapping[str, str]) -> str:
    """HYPOTHESIS_PROFILE if set, else difftest-ci under CI (any value but '', 0, false, no), else difftest-dev."""
    explicit = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if explicit:
        return explicit
    ci = environ.get("CI", "").strip().lower()
    return "difftest-ci" if ci not in ("", "0", "false", "no") else "difftest-dev"


settings.load_profile(hypothesis_profile(os.environ))


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """The suite's tensors are tiny: a second intra-op thread only adds synchronisation (up to 8x
    slower per call on a busy 2-core machine). Benchmarks, not tests, measure threaded speed."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# pytester for the plugin tests under tests/difftest_pytest (pytest_plugins is honoured only here).
pytest_plugins = ["pytester"]
