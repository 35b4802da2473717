"""The root conftest: hypothesis profiles and how one is chosen."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import HealthCheck, settings

from tests.support import REPO_ROOT

# What the root conftest loaded when pytest started, before the fixture below imports it again.
LOADED_AT_START = settings()


@pytest.fixture(scope="module")
def root_conftest():
    spec = importlib.util.spec_from_file_location("difftest_root_conftest", REPO_ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("environ, profile", [
    ({}, "difftest-dev"),
    ({"CI": "true"}, "difftest-ci"),
    ({"CI": "1"}, "difftest-ci"),
    ({"CI": "false"}, "difftest-dev"),
    ({"CI": ""}, "difftest-dev"),
    ({"HYPOTHESIS_PROFILE": "difftest-nightly"}, "difftest-nightly"),
    ({"HYPOTHESIS_PROFILE": "difftest-nightly", "CI": "true"}, "difftest-nightly"),
    ({"HYPOTHESIS_PROFILE": "default", "CI": "true"}, "default"),
])
def test_profile_selection(root_conftest, environ, profile):
    assert root_conftest.hypothesis_profile(environ) == profile, f"{environ=}"


def test_profiles_registered(root_conftest):
    ci, nightly = settings.get_profile("difftest-ci"), settings.get_profile("difftest-nightly")
    assert ci.deadline is None and ci.derandomize and HealthCheck.too_slow in ci.suppress_health_check, f"{ci=}"
    assert 10 <= ci.max_examples <= 100, f"{ci.max_examples=}"
    assert nightly.max_examples > ci.max_examples and nightly.deadline is None, f"{nightly=}"
    assert settings.get_profile("difftest-dev").deadline is None


def test_loaded_profile_follows_the_environment(root_conftest, request):
    # hypothesis' own --hypothesis-profile option, when given, wins over the environment.
    name = request.config.getoption("hypothesis_profile", None) or root_conftest.hypothesis_profile(os.environ)
    chosen = settings.get_profile(name)
    current = LOADED_AT_START
    assert (current.max_examples, current.derandomize, current.deadline) == (
        chosen.max_examples, chosen.derandomize, chosen.deadline), f"{current=} {chosen=}"


def test_repo_root_importable():
    import difftest

    assert REPO_ROOT.joinpath("difftest", "__init__.py").samefile(difftest.__file__)
