"""Hypothesis under the plugin: difftest's settings profiles by name, and no deadline for hypothesis
tests that use difftest while nobody chose their settings.

Hypothesis' plugin loads `--hypothesis-profile NAME` in its pytest_configure; registering difftest's
profiles first (tryfirst, and only when NAME is one of them, so an unrelated run never imports
hypothesis here) makes `--hypothesis-profile=difftest-ci` work in any project.

Why no deadline by default: a difftest check's first call imports and compiles kernels (0.7 s on a CPU
is usual), past hypothesis' default 200 ms; the example fails as DeadlineExceeded, its fast replay
passes, and hypothesis reports Flaky instead of the bug. A test keeps its deadline when it has
`@settings(...)` of its own, or when a profile other than hypothesis' `default` is loaded.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence

import pytest

PROFILE_OPTION = "hypothesis_profile"  # where pytest keeps hypothesis' --hypothesis-profile
DIFFTEST_PROFILES = ("difftest-ci", "difftest-nightly", "difftest-dev")  # difftest.generators.profiles.PROFILES


def register_named(config: pytest.Config) -> None:
    """Register difftest's profiles when --hypothesis-profile names one of them."""
    if config.getoption(PROFILE_OPTION, None) in DIFFTEST_PROFILES:
        from difftest.generators.profiles import register_profiles  # deferred: imports hypothesis

        register_profiles()


def lift_deadlines(items: Sequence[pytest.Item]) -> None:
    """Turn the deadline off for every collected hypothesis test in a module that imports difftest and
    whose settings nobody chose (no @settings, hypothesis' default profile loaded)."""
    if "hypothesis" not in sys.modules:  # no collected module used hypothesis
        return
    from hypothesis import is_hypothesis_test, settings
    from hypothesis.errors import InvalidArgument

    if settings.get_current_profile_name() != "default":
        return
    for item in items:
        if not (isinstance(item, pytest.Function) and is_hypothesis_test(item.function)
                and _imports_difftest(item.module)):
            continue
        try:
            settings(settings.default, deadline=None)(item.function)
        except InvalidArgument:  # @settings of its own, or an earlier parametrized item of the same test
            continue


def _imports_difftest(module: types.ModuleType | None) -> bool:
    return module is not None and any(_from_difftest(value) for value in vars(module).values())


def _from_difftest(value: object) -> bool:
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    return isinstance(name, str) and (name == "difftest" or name.startswith("difftest."))
