"""Hypothesis under the plugin: difftest's profiles by name, and no deadline for the hypothesis tests of
modules that use difftest unless their settings were chosen.

These run pytest in a subprocess: this process has already loaded a profile (the root conftest), and
both behaviours depend on what a fresh process starts with."""

from __future__ import annotations

import pytest

from difftest.generators.profiles import PROFILES
from difftest_pytest.profiles import DIFFTEST_PROFILES

# The first example of each test takes 300 ms (as a kernel's first, compiling call does), the rest none.
SLOW_FIRST = """
import time

from hypothesis import given, settings, strategies as st
{imports}

def slow_once(test, seen=set()):
    time.sleep(0 if test in seen else 0.3)
    seen.add(test)
{tests}
"""
USES_DIFFTEST = SLOW_FIRST.format(imports="import difftest", tests='''
@given(st.integers())
def test_lifted(n):
    slow_once("lifted")


@settings(deadline=200)
@given(st.integers())
def test_own_settings(n):
    slow_once("own")
''')
PLAIN = SLOW_FIRST.format(imports="", tests='''
@given(st.integers())
def test_other(n):
    slow_once("other")
''')


def test_the_plugin_names_the_profiles_of_difftest_generators() -> None:
    assert DIFFTEST_PROFILES == PROFILES


@pytest.fixture
def slow_tests(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # Under a CI variable hypothesis itself starts from its "ci" profile, which has no deadline.
    for name in ("CI", "TF_BUILD", "GITHUB_ACTIONS", "BUILDKITE"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_uses=USES_DIFFTEST, test_plain=PLAIN)
    return pytester


def test_only_the_difftest_module_without_settings_of_its_own_loses_the_deadline(slow_tests: pytest.Pytester) -> None:
    result = slow_tests.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["FAILED test_plain.py::test_other - *", "FAILED test_uses.py::test_own_settings - *"],
                                consecutive=False)


def test_a_difftest_profile_loads_by_name(slow_tests: pytest.Pytester) -> None:
    # test_other passes only if difftest-ci (no deadline) is what hypothesis loaded.
    result = slow_tests.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--hypothesis-profile=difftest-ci",
                                             "-k", "not own_settings")
    result.assert_outcomes(passed=2)  # an unregistered profile would be an INTERNALERROR
