"""Files only their owner may read: true models, keys, seeds, passwords.

Each is created with its mode by `os.open` (never chmod-ed afterwards, so never readable by
others even for an instant), written whole under a temporary name and renamed into place,
so a crash mid-write leaves the previous version; directories that hold them are 0700.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

PRIVATE = 0o600
PRIVATE_DIR = 0o700
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def _new(path: Path, mode: int) -> tuple[Path, int]:
    """`path`'s temporary file, created with `mode`, and its descriptor."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        return tmp, os.open(tmp, _NEW, mode)
    except FileExistsError:  # left by a crash: O_EXCL, for an old file would keep its mode
        tmp.unlink()
        return tmp, os.open(tmp, _NEW, mode)


@contextlib.contextmanager
def private_file(path: Path, mode: int = PRIVATE) -> Iterator[BinaryIO]:
    """A binary file to write `path` through (np.savez, say), created with `mode`."""
    tmp, fd = _new(path, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_private(path: Path, data: bytes | str, mode: int = PRIVATE) -> Path:
    """Write `data` (text as UTF-8) to `path`, created with `mode`: by `os.write`, with no
    file object (whose fstat, isatty and lseek are three syscalls of the seven a checkpoint
    took; agents checkpoint often, issue 31)."""
    view = memoryview(data.encode() if isinstance(data, str) else data)
    tmp, fd = _new(path, mode)
    try:
        try:
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def private_dir(path: Path) -> Path:
    """`path` and its missing parents, `path` itself 0700 (if it exists already: made so)."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != PRIVATE_DIR:
        path.chmod(PRIVATE_DIR)
    return path
