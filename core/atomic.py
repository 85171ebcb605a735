"""Files in and out with one-line errors; writes are atomic (a reader sees the old file or the whole new one)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from core.errors import PgolfError


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to a temp file beside `path`, then rename it over `path`.

    A failure (no permission, full disk, a folder in the way) raises PgolfError
    naming `path`, and leaves neither a temp file nor a changed `path` behind.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise PgolfError(f"cannot write {str(path)!r}: not a file name")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes files private; outputs are ordinary files
        os.replace(tmp, path)
    except OSError as exc:
        raise PgolfError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:  # gone already when the rename succeeded
            Path(tmp).unlink(missing_ok=True)
    return path


def make_dir(path: str | Path, what: str = "folder") -> Path:
    """mkdir -p, with a PgolfError naming the folder (as `what`) when that is impossible."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PgolfError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    return path


def read_file(path: str | Path, what: str) -> bytes:
    """The bytes of `path`; a PgolfError naming it (as `what`, e.g. "checkpoint") when unreadable."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise PgolfError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
