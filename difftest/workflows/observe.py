"""Observers: how a test runner hears every difftest.check() result and says where failing cases
leave a reproducer bundle. Light on purpose: the pytest plugin attaches one without importing torch."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from difftest.engine.result import CaseResult


@dataclasses.dataclass(frozen=True)
class Observer:
    """What a test runner attaches to check(): who hears each result, where failures' bundles go."""

    on_result: Callable[[CaseResult], None] | None = None
    repro_dir: Path | None = None  # failing cases are written here (difftest.records.bundle) to be replayed


_OBSERVER: contextvars.ContextVar[Observer | None] = contextvars.ContextVar("difftest_check_observer",
                                                                           default=None)


@contextlib.contextmanager
def observed(observer: Observer) -> Iterator[None]:
    """Every check() inside the block reports to `observer`."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def current_observer() -> Observer | None:
    """The observer of the innermost `observed` block, if any."""
    return _OBSERVER.get()
