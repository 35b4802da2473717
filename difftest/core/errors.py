"""The error types: SpecError for impossible input (it names the field, its value and what is allowed),
OutputError for an output that cannot be written, Interrupted for a run stopped by Ctrl-C; and how a
caught exception is quoted (exception_text, first_line), whatever its __str__ does."""

from __future__ import annotations

from typing import Any


class SpecError(ValueError):
    """A case, spec, option or tensor that cannot describe a paged MQA logits problem."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}={value!r}: expected {expected}")


def require(condition: bool, field: str, value: Any, expected: str) -> None:
    """Raise SpecError(field, value, expected) unless condition holds."""
    if not condition:
        raise SpecError(field, value, expected)


class OutputError(Exception):
    """An output (report, stream, bundle, lock) that cannot be written: names the parameter that gave
    its path, the path and why. Not a SpecError: the request was fine, the filesystem was not."""

    def __init__(self, field: str, path: Any, reason: str) -> None:
        self.field = field
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{field}={self.path!r}: {reason}")


class Interrupted(Exception):
    """A run stopped by Ctrl-C after keeping what finished: `results` of them, in `kept` (the paths
    of the stream and of the report marked incomplete); `resumable` when the stream can continue it (a run's;
    a fuzz campaign's cannot)."""

    def __init__(self, results: int, kept: tuple[str, ...], resumable: bool = True) -> None:
        self.results = results
        self.kept = kept
        self.resumable = resumable
        super().__init__(f"interrupted after {results} results" + (f"; kept in {', '.join(kept)}" if kept else ""))


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ('' when it has none): CUDA's out-of-memory errors run on
    for lines of advice that a result's reason or a campaign's summary does not need."""
    lines = message(exc).splitlines()
    return lines[0] if lines else ""


def message(exc: BaseException) -> str:
    """str(exc), which is the exception's own code: when that raises (or returns no str), what it raised
    instead, so quoting a backend's exception never raises in its turn."""
    try:
        return str(exc)
    except KeyboardInterrupt:  # a Ctrl-C while it ran is the user's, not the exception's
        raise
    except BaseException as inner:  # any __str__ may fail (a SystemExit too); say how, without calling it again
        return f"<str() of this {type(exc).__name__} raised {type(inner).__name__}>"


def exception_text(exc: BaseException) -> str:
    """'RuntimeError: message': an exception as a result's reason or an error line quotes it."""
    return f"{type(exc).__name__}: {message(exc)}"
