"""Where the matrix commands write: `matrix emit`'s file and `matrix merge`'s folder, checked before
any work is done (planning loads every backend's contract, merging reads every report).

A path that cannot take the output is one line at once: an empty path, a folder where a file goes, a
file where a folder goes, a device, FIFO or socket (the commands write regular files only: a device
replaced by a file, as root, is a broken machine), a read-only or full filesystem (a probe file is
written, as `difftest run` does for its report). A symbolic link is written through: the file it
points at is replaced, atomically, and the link stays.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from difftest.core.errors import OutputError, require
from difftest.core.files import check_writable

KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISSOCK, "a socket"))


def output_file(path: str | Path, field: str) -> Path:
    """The regular file to write for `path` (a link's target, through every link), checked writable;
    SpecError for an empty path, OutputError naming `field` for anything else it cannot be."""
    require(str(path) != "", field, str(path), "a file path")
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(field, path, f"cannot write: {exc.strerror or exc}") from None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        kind = next((words for test, words in KINDS if test(mode)), "not a regular file")
        raise OutputError(field, path, f"cannot write: {kind} is there (only regular files are written)")
    check_writable(target, field)
    return target


def output_folder(path: str | Path, field: str) -> Path:
    """`path` as a folder to write files in (made when absent), checked writable; SpecError for an
    empty path, OutputError naming `field` where something else is there or nothing can be written."""
    require(str(path) != "", field, str(path), "a folder path")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise OutputError(field, path, "cannot write: a file is there, not a folder")
    check_writable(folder, field, folder=True)
    return folder
