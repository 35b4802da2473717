"""difftest's pytest plugin: entry point `difftest` of the pytest11 group (`-p no:difftest` turns it off).

pytest loads this module in every run of an environment where difftest is installed, so loading it
imports neither torch nor difftest: what is heavy is imported inside the hooks and fixtures that
need it. This module holds the hooks every run gets: the options (options.py), the markers
(markers.py), difftest's hypothesis profiles and deadlines (profiles.py), the report header with
the seed (only in a run that uses difftest), and the fixtures; the stateful parts are plugin
objects registered at configure time: results and summary (results.py) always, the suite
(suite.py) with --difftest-suite, the ledger (ledger.py) with --difftest-ledger, and the seed hand-over
(workers.py) when pytest-xdist is loaded.

    def test_my_kernel(difftest_backend, difftest_case):
        difftest.check(difftest_backend, difftest_case)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from difftest_pytest import markers, profiles
from difftest_pytest.ledger import LedgerPlugin, load
from difftest_pytest.options import add_options, options_given, read_settings
from difftest_pytest.results import Recorder
from difftest_pytest.selection import Selection, case_ids, per_backend
from difftest_pytest.suite import SuitePlugin
from difftest_pytest.workers import SeedToWorkers, pin_gpu

if TYPE_CHECKING:
    from difftest.backends import Loaded

SELECTION = pytest.StashKey[Selection]()
FIXTURES = frozenset({"difftest_backend", "difftest_case", "difftest_seed"})


def pytest_addoption(parser: pytest.Parser) -> None:
    """The `difftest` option group."""
    add_options(parser)


@pytest.hookimpl(tryfirst=True)  # before hypothesis' plugin loads the --hypothesis-profile it is given
def pytest_configure(config: pytest.Config) -> None:
    """Register the markers and, when --hypothesis-profile names one, difftest's hypothesis profiles;
    check the options, and register the plugin objects they ask for."""
    markers.register(config)
    profiles.register_named(config)
    settings = read_settings(config)
    selection = Selection(settings)
    if settings.backends is not None:
        selection.targets()  # a mistyped backend name is a usage error now, not at collection
    config.stash[SELECTION] = selection
    manager = config.pluginmanager
    manager.register(Recorder(config, settings), "difftest-results")
    if settings.suite:
        manager.register(SuitePlugin(selection), "difftest-suite")
    if settings.ledger is not None:
        manager.register(LedgerPlugin(load(settings.ledger)), "difftest-ledger")
    if manager.hasplugin("xdist"):
        manager.register(SeedToWorkers(settings.seed), "difftest-xdist")
    if settings.device == "cuda":
        pin_gpu(config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The seed and the options that draw the same cases again, when the command line sets a difftest
    option; otherwise pytest_report_collectionfinish prints them if a collected test uses difftest."""
    return [config.stash[SELECTION].settings.header()] if options_given(config) else []


def pytest_report_collectionfinish(config: pytest.Config, items: Sequence[pytest.Item]) -> list[str]:
    """The header line, for a run that sets no difftest option (so no --difftest-suite) but collected
    tests that use difftest's fixtures; nothing in a run that does not use difftest (pytest-xdist's
    controller collects nothing: there the seed is in the `difftest` summary)."""
    if options_given(config) or not any(FIXTURES.intersection(getattr(item, "fixturenames", ())) for item in items):
        return []
    return [config.stash[SELECTION].settings.header()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize difftest_backend over the selected backends and difftest_case over the selected cases
    (of --difftest-op's operation), as the test's difftest marker restricts them; a test taking both under
    --difftest-cases envelope gets each backend with the cases of its own envelope plan only."""
    wanted = [name for name in ("difftest_backend", "difftest_case") if name in metafunc.fixturenames]
    if not wanted:
        return
    selection = metafunc.config.stash[SELECTION]
    backends, next_n = markers.difftest_restrictions(metafunc.definition.get_closest_marker("difftest"))
    ids = selection.backend_ids(backends) if "difftest_backend" in wanted else []
    cases = selection.cases(next_n) if "difftest_case" in wanted else []
    if len(wanted) == 2 and any(case.backends is not None for case in cases):
        pairs = per_backend(ids, cases)
        metafunc.parametrize(wanted, [(b, c) for b, c, _ in pairs], ids=[f"{b}-{i}" for b, _, i in pairs],
                             indirect=True)
        return
    if "difftest_backend" in wanted:
        metafunc.parametrize("difftest_backend", ids, ids=ids, indirect=True)
    if "difftest_case" in wanted:
        metafunc.parametrize("difftest_case", cases, ids=case_ids(cases), indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip, with the exact reason, every test whose hardware marker this machine does not meet; lift
    hypothesis' deadline from the hypothesis tests that use difftest, unless their settings were chosen."""
    markers.skip_missing_hardware(items)
    profiles.lift_deadlines(items)


@pytest.fixture
def difftest_backend(request: pytest.FixtureRequest) -> Loaded:
    """One selected backend of --difftest-op's operation per test (--difftest-backends, or every registered
    one); where it cannot run on --difftest-device the test is skipped with the backend's unavailable_reason."""
    return request.config.stash[SELECTION].backend(request.param)


@pytest.fixture
def difftest_case(request: pytest.FixtureRequest) -> Any:
    """One seeded case of --difftest-op's operation per test (--difftest-cases, drawn from --difftest-seed) on
    --difftest-device: a difftest.Case for paged logits, a TopkCase, RaggedCase, ... for the others."""
    return request.config.stash[SELECTION].build(request.param)


@pytest.fixture
def difftest_seed(request: pytest.FixtureRequest) -> int:
    """The run's seed: --difftest-seed, or the random one in the header; the same on every xdist worker."""
    return request.config.stash[SELECTION].settings.seed
