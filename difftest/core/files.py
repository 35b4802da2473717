"""Files a run writes: atomically (a reader or a crash sees the old file or the new one), probed for
writability before any case runs, and locked against a second run writing the same path."""

from __future__ import annotations

import os
from pathlib import Path

from difftest.core.errors import OutputError

LOCK_SUFFIX = ".lock"


def cannot_write(exc: OSError) -> str:
    """'cannot write: No space left on device' of an OSError, on one line."""
    return f"cannot write: {exc.strerror or exc}"


def atomic_write(path: str | Path, data: str | bytes, field: str) -> Path:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never a
    part: into `path.tmp-<pid>` beside it, fsync'd, then renamed over `path`. OutputError names `field`."""
    path = Path(path)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        sync_folder(path.parent)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(field, path, cannot_write(exc)) from None
    return path


def sync_folder(folder: Path) -> None:
    """fsync a folder, so a rename in it survives a power cut (where the platform allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder
    finally:
        os.close(fd)


def check_writable(path: Path, field: str, folder: bool = False) -> None:
    """OutputError naming `field` unless a file can be made at `path` (in the folder `path` when
    `folder`): the folder is made, and a one-byte probe file written, fsync'd and removed in it, so a
    read-only or full filesystem is found before any case runs."""
    where = path if folder else path.parent
    if not folder and path.is_dir():
        raise OutputError(field, path, "cannot write: a folder is there")
    probe = where / f".difftest-probe-{os.getpid()}"
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        if not folder and path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise OutputError(field, path, cannot_write(exc)) from None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: os.kill said it exists
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


class OutputLock:
    """`<path>.lock`, made with O_CREAT | O_EXCL and holding the pid of the run writing `path`: a second
    run on the same path is OutputError naming the holder. A lock whose pid is gone (a run killed
    with SIGKILL) is taken over, and `note` says so. release() removes it."""

    def __init__(self, path: Path, field: str) -> None:
        self.path, self.field = Path(path), field
        self.lock = self.path.with_name(self.path.name + LOCK_SUFFIX)
        self.note: str | None = None
        self.held = False

    def acquire(self) -> OutputLock:
        for _ in range(3):
            try:
                fd = os.open(self.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and (holder == os.getpid() or pid_alive(holder)):
                    raise OutputError(self.field, self.path, f"another run (pid {holder}) is writing it: "
                                      f"lock {self.lock}") from None
                self.lock.unlink(missing_ok=True)  # stale: its run is gone
                self.note = f"took over the stale lock {self.lock} of pid {holder}, which no longer runs"
                continue
            except OSError as exc:
                raise OutputError(self.field, self.lock, cannot_write(exc)) from None
            try:
                os.write(fd, f"{os.getpid()}\n".encode())
                os.fsync(fd)
            except OSError as exc:
                os.close(fd)
                self.lock.unlink(missing_ok=True)
                raise OutputError(self.field, self.lock, cannot_write(exc)) from None
            os.close(fd)
            self.held = True
            return self
        raise OutputError(self.field, self.path, f"could not take the lock {self.lock}")

    def _holder(self) -> int | None:
        try:
            text = self.lock.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                if self._holder() == os.getpid():
                    self.lock.unlink()
            except OSError:
                pass
