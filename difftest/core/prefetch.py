"""Work done ahead, in a thread: the next items of an iterator, each already transformed.

A fuzz campaign's main thread spends much of a batch waiting on its workers' answers (a pipe's poll,
which releases the GIL) and the rest judging; drawing the next batch in a thread fills those waits.
Torch releases the GIL inside its operators, so even the two threads' busy times overlap in part.

Items come out in the source's order. An exception raised by the source or by the work is raised to
the consumer where its item would have come, after every item before it. Nothing runs more than
`depth` items ahead of the consumer, and closing (the `with` block's end) stops the thread after the
item it is working on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

Job = TypeVar("Job")
Done = TypeVar("Done")

_POLL_SECONDS = 0.05  # how often a thread waiting for room looks whether it was closed


class _End:
    """The source is exhausted."""


_END = _End()


class _Raised:
    """The source or the work raised `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetched(Generic[Job, Done]):
    """(job, work(job)) for each job of `jobs`, computed in a thread: at most `depth` jobs are taken from
    `jobs` and not yet handed to the consumer (the one being worked on included).

    `setup` runs first in the thread (a GPU run makes the thread's current device the caller's)."""

    def __init__(self, jobs: Iterator[Job], work: Callable[[Job], Done], depth: int = 1,
                 setup: Callable[[], None] | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._ready: queue.SimpleQueue[tuple[Job, Done] | _End | _Raised] = queue.SimpleQueue()
        self._room = threading.Semaphore(depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(jobs, work, setup), name="difftest-prefetch",
                                        daemon=True)
        self._thread.start()

    def __enter__(self) -> Prefetched[Job, Done]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[Job, Done]]:
        while True:
            got = self._ready.get()
            if isinstance(got, _End):
                return
            if isinstance(got, _Raised):
                raise got.error
            self._room.release()
            yield got

    def close(self) -> None:
        """Stop the thread (after the job it is on) and wait for it."""
        self._closed.set()
        self._thread.join()

    def _fill(self, jobs: Iterator[Job], work: Callable[[Job], Done], setup: Callable[[], None] | None) -> None:
        try:
            if setup is not None:
                setup()
            while self._room_taken():
                job = next(jobs, _END)
                if job is _END:
                    self._ready.put(_END)
                    return
                self._ready.put((job, work(job)))
        except BaseException as error:  # every error belongs to the consumer, in its place
            self._ready.put(_Raised(error))

    def _room_taken(self) -> bool:
        """Wait for room for one more job; False when closed first."""
        while not self._closed.is_set():
            if self._room.acquire(timeout=_POLL_SECONDS):
                return True
        return False
