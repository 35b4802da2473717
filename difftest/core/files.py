"""Files a run writes: atomically (a reader or a crash sees the old file or the new one), probed for
writability before any case runs, and locked against a second run writing the same path.

Only regular files are written. A path that is a symbolic link is written through (the file it points
to is the one replaced, as an editor saves through a link); a path that holds anything else, a device
such as /dev/full, a FIFO, a socket or a folder, is refused (OutputError) rather than replaced by a file
or blocked on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from pathlib import Path

from difftest.core.errors import OutputError

LOCK_SUFFIX = ".lock"
_KINDS = {stat.S_ISDIR: "a folder", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
          stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}


def cannot_write(exc: OSError) -> str:
    """'cannot write: No space left on device' of an OSError, on one line."""
    return f"cannot write: {exc.strerror or exc}"


def regular_target(path: str | Path, field: str) -> Path:
    """The file a write to `path` replaces: `path`, or for a symbolic link the path it resolves to.
    OutputError naming `field` when something other than a regular file is there (a folder: 'a folder is
    there'), or the path cannot be looked at (a name too long, a loop of links)."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise OutputError(field, path, cannot_write(exc)) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(field, path, mode)
    return target


def _not_regular(field: str, path: str | Path, mode: int) -> OutputError:
    if stat.S_ISDIR(mode):
        return OutputError(field, path, "cannot write: a folder is there")
    kind = next((kind for test, kind in _KINDS.items() if test(mode)), "something other than a file")
    return OutputError(field, path, f"cannot write: {kind} is there (difftest writes regular files only)")


def open_regular(path: str | Path, flags: int, field: str) -> int:
    """os.open of the regular file a write to `path` goes to (regular_target), with `flags`; OutputError
    naming `field` when it cannot be opened or turns out not to be a regular file (opened without
    blocking, so a FIFO put there since is refused, not waited on)."""
    target = regular_target(path, field)
    try:
        fd = os.open(target, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise OutputError(field, path, cannot_write(exc)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(field, path, mode)
    os.set_blocking(fd, True)
    return fd


def holds_output(path: Path) -> bool:
    """Whether `path` holds something written: anything but an empty regular file (what `mktemp` makes
    for a report to go to) or nothing at all."""
    try:
        found = os.stat(path)
    except OSError:
        return False
    return not (stat.S_ISREG(found.st_mode) and found.st_size == 0)


def atomic_write(path: str | Path, data: str | bytes, field: str) -> Path:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never a
    part: into `path.tmp-<pid>` beside it, fsync'd, then renamed over `path` (over the file a link at
    `path` points to: regular_target). OutputError names `field`. Returns `path`."""
    given = Path(path)
    path = regular_target(given, field)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
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
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise OutputError(field, given, cannot_write(exc)) from None
    return given


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
    `folder`): what is at `path` must be a regular file or nothing (regular_target), the folder is made,
    and a one-byte probe file written, fsync'd and removed in it, so a read-only or full filesystem is
    found before any case runs."""
    where = path if folder else regular_target(path, field).parent
    probe = where / f".difftest-probe-{os.getpid()}"
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
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
    """`<path>.lock`, holding the pid of the run writing `path` and flock()ed by it while it writes: a
    second run on the same path is OutputError naming the holder. A lock nobody holds (its run was
    killed with SIGKILL: the kernel drops an flock with its process, however the process ends) is taken
    over, and `note` says so. release() removes it.

    Whether a lock is held is the flock's answer, not its pid's: a pid is reused (a container's runs
    count from the same small numbers), an flock is not. The lock appears whole: its pid is written to
    a file of this process's own, which is then linked to the lock's name (link() fails where a file
    is already there), flock()ed before it is linked, so no run ever finds a lock without its pid or
    without its flock. A stale lock is taken over under its flock, so two runs finding the same stale
    lock cannot both take it."""

    def __init__(self, path: Path, field: str) -> None:
        self.path, self.field = Path(path), field
        self.lock = self.path.with_name(self.path.name + LOCK_SUFFIX)
        self.note: str | None = None
        self.held = False
        self.fd: int | None = None  # the lock file, flock()ed while held

    def acquire(self) -> OutputLock:
        """Take the lock (OutputError when a live run holds it, or it cannot be made)."""
        for _ in range(_LOCK_ATTEMPTS):
            fd = self._created() or self._stale()
            if fd is not None:
                self.fd, self.held = fd, True
                return self
        raise OutputError(self.field, self.path, f"could not take the lock {self.lock}")

    def _created(self) -> int | None:
        """A new lock, flock()ed and holding this process's pid from the moment it has its name; None
        when a lock is already there."""
        try:
            fd, mine = tempfile.mkstemp(prefix=f".{self.lock.name}.", dir=self.lock.parent)
        except OSError as exc:
            raise OutputError(self.field, self.lock, cannot_write(exc)) from None
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.fsync(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)  # its own file: no one else has it open yet
            os.link(mine, self.lock)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, FileExistsError):
                return None
            if isinstance(exc, OSError):
                raise OutputError(self.field, self.lock, cannot_write(exc)) from None
            raise
        finally:
            with contextlib.suppress(OSError):
                os.unlink(mine)
        return fd

    def _stale(self) -> int | None:
        """The lock there, taken over when no run holds it (this pid written over the old one under the
        flock); OutputError when a run holds it; None when it went away meanwhile."""
        fd = self._opened()
        if fd is None:
            return None
        try:
            flocked = _try_flock(fd)
            holder = _pid_in(fd)
            if not flocked:
                raise OutputError(self.field, self.path, f"another run (pid {holder}) is writing it: "
                                  f"lock {self.lock}")
            if not _same_file(fd, self.lock):  # released and removed since it was opened
                os.close(fd)
                return None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        self.note = f"took over the stale lock {self.lock} of pid {holder}, whose run no longer holds it"
        return fd

    def _opened(self) -> int | None:
        try:
            return os.open(self.lock, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise OutputError(self.field, self.lock, cannot_write(exc)) from None

    def release(self) -> None:
        """Remove the lock (while still holding its flock, so no run takes the file being removed)."""
        if self.held and self.fd is not None:
            self.held = False
            fd, self.fd = self.fd, None
            try:
                if _same_file(fd, self.lock):
                    self.lock.unlink()
            except OSError:
                pass
            finally:
                os.close(fd)


_LOCK_ATTEMPTS = 5  # each lost only to another run creating or removing the lock at that very moment


def _try_flock(fd: int) -> bool:
    """flock(fd) without waiting: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _pid_in(fd: int) -> int | None:
    text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open at `fd`."""
    try:
        found, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)
