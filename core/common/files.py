"""Files in and out with one-line errors.

Writes are atomic and durable: a reader sees the old file or the whole new one, also after
a kill -9 or a power loss. The bytes go to a temp file beside the target, named
`.<name>.pgolf-<pid>-<random>.tmp`, which is fsynced, renamed over the target, and the folder
is fsynced. A temp file left by a killed writer (its process gone) is removed by the next
write into the same folder.

Every file pgolf reads goes through `open_regular` and the readers built on it: regular files only (a
FIFO, a device, a socket or a folder is refused before anything is read; a link counts as what it
names), of a bounded size where the file has a natural one; text decoded as UTF-8 with a bad byte
named by its line; JSON parsed with a bounded nesting depth and integer length, NaN and Infinity
refused, and no lone surrogate in its strings (`parse_json`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

from core.common.errors import PgolfError

MAX_JSON_DEPTH = 64  # objects and arrays nested deeper than any file pgolf writes or reads
MAX_INT_DIGITS = 40  # an integer longer than this is no count, size or seed of pgolf's
MAX_LINE_BYTES = 1 << 28  # one line of a JSON-lines or log file; longer is not a document or a log line

_TEMP = re.compile(r"\..+\.pgolf-(\d+)-[^.]+\.tmp")  # what write_atomic names its temp files


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to a temp file beside `path`, fsync it, rename it over `path`, fsync the folder.

    A failure (no permission, full disk, a folder in the way) raises PgolfError
    naming `path`, and leaves neither a temp file nor a changed `path` behind.
    """
    path = Path(path)
    if path.name in ("", ".."):  # Path(".").name is ""
        raise PgolfError(f"cannot write {str(path)!r}: not a file name")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path.parent)
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.pgolf-{os.getpid()}-", suffix=".tmp"
        )
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes files private; outputs are ordinary files
        os.replace(tmp, path)  # onto a folder: IsADirectoryError
        sync(path.parent)
    except OSError as exc:
        raise PgolfError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:  # gone already when the rename succeeded
            Path(tmp).unlink(missing_ok=True)
    return path


def sync(path: str | Path) -> None:
    """fsync a file, or a folder so that a rename into it survives a power loss (where the system allows it)."""
    with contextlib.suppress(OSError):  # some file systems do not sync folders; a rename is still atomic
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_temps(folder: str | Path) -> None:
    """Delete the temp files of write_atomic in `folder` whose writing process is gone."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = _TEMP.fullmatch(name)
        if match:
            try:
                os.kill(int(match[1]), 0)  # signal 0: nothing is sent, the process is only looked up
            except (ProcessLookupError, OverflowError):  # gone (PermissionError: another user's)
                Path(folder, name).unlink(missing_ok=True)
            except PermissionError:
                pass


def append_line(path: str | Path, line: str) -> None:
    """Append one line to a text file (a log); a failure (a full disk) is a PgolfError naming the file."""
    with contextlib.suppress(OSError):  # a FIFO there would hang the writer until a reader came
        if stat.S_ISFIFO(os.stat(path).st_mode):
            raise PgolfError(f"cannot write {path}: a FIFO, not a regular file")
    try:  # (and opened without blocking, should one appear meanwhile)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
        with open(fd, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        raise PgolfError(f"cannot write {path}: {exc.strerror or exc}") from None


def make_dir(path: str | Path, what: str = "folder") -> Path:
    """mkdir -p, with a PgolfError naming the folder (as `what`) when that is impossible."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PgolfError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    return path


def open_regular(path: str | Path, what: str, max_bytes: int | None = None) -> BinaryIO:
    """`path` opened for reading, if it is a regular file of at most `max_bytes`; else a PgolfError
    naming it (as `what`, e.g. "checkpoint"). Opening never blocks, even on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise PgolfError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file (a folder, a FIFO or a device)"
    elif max_bytes is not None and info.st_size > max_bytes:
        problem = f"is {info.st_size:,} bytes, over the limit of {max_bytes:,}"
    else:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    os.close(fd)
    raise PgolfError(f"{what} {path} {problem}")


def read_file(path: str | Path, what: str, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file `path` (see `open_regular`); a PgolfError naming it when unreadable."""
    with open_regular(path, what, max_bytes) as f:
        try:
            return f.read()
        except OSError as exc:
            raise PgolfError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None


def file_sha256(path: str | Path, what: str = "shard") -> str:
    """The SHA-256 of a file, read in pieces (a shard is ~200 MB); `what` names it in an error."""
    digest = hashlib.sha256()
    with open_regular(path, what) as f:
        while piece := f.read(1 << 23):
            digest.update(piece)
    return digest.hexdigest()


class WriterLock:
    """One writer of a folder at a time: an exclusive lock on the folder itself, held until `release`
    (or the process ends: the kernel drops it then, so a killed holder never blocks the next writer).
    While it is held, `.writer.pid` in the folder names the holder, so that a refused writer can.
    A file can be locked too (without the name of its holder)."""

    def __init__(self, folder: str | Path, what: str):
        folder = Path(folder)
        self.pid_file = folder / ".writer.pid"
        try:
            self.fd = os.open(folder, os.O_RDONLY)
        except OSError as exc:
            raise PgolfError(f"cannot lock {what} {folder}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            try:
                holder = "process " + self.pid_file.read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError):
                holder = "another process"
            raise PgolfError(f"{what} {folder} is in use by {holder}: one writer at a time") from None
        # The lock holds without it; a refused writer then cannot name the holder.
        with contextlib.suppress(OSError):
            self.pid_file.write_text(f"{os.getpid()}\n", encoding="ascii")

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):  # none beside a locked file (a sweep spec)
                self.pid_file.unlink(missing_ok=True)
            os.close(self.fd)  # closing drops the lock
            self.fd = -1

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


# --------------------------------------------------------------------- text and JSON
def read_text(path: str | Path, what: str, max_bytes: int | None = None) -> str:
    """The UTF-8 text of the regular file `path`; a byte that is not UTF-8 is named by its line."""
    data = read_file(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PgolfError(f"{what} {path}: line {line} is not UTF-8 text") from None


def text_lines(path: str | Path, what: str, max_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """The lines of the regular file `path` (of at most `max_bytes`) with their numbers (from 1), streamed,
    newline kept off; a line that is not UTF-8 or longer than MAX_LINE_BYTES is a PgolfError naming the
    file and line."""
    with open_regular(path, what, max_bytes) as f:
        number = 0
        while True:
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise PgolfError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise PgolfError(f"{what} {path}: line {number} is over {MAX_LINE_BYTES:,} bytes long")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise PgolfError(f"{what} {path}: line {number} is not UTF-8 text") from None
            yield number, text.rstrip("\r\n") if text.endswith("\n") else text


def read_json(path: str | Path, what: str, max_bytes: int, exact: bool = False) -> Any:
    """The JSON value in the regular file `path` (see `parse_json`)."""
    return parse_json(read_text(path, what, max_bytes), f"{what} {path}", exact)


def parse_json(
    text: str | bytes, where: str, exact: bool = False, unique_keys: bool = False, finite: bool = True
) -> Any:
    """`text` parsed as JSON, or a PgolfError starting with `where` (the file, and its line where it has
    lines). Refused: nesting deeper than MAX_JSON_DEPTH, an integer of more than MAX_INT_DIGITS digits,
    NaN, Infinity and numbers out of float range, a string with a lone surrogate (it has no UTF-8), and
    with `unique_keys` an object that gives a key twice. With `exact` the numbers with a fraction or
    exponent are Decimals, as written. With `finite` False, NaN and Infinity are floats (as Python's
    json.dumps writes a figure that is not finite: a diverged run's metrics)."""
    try:
        value = json.loads(
            text,
            parse_int=_json_int,
            parse_float=_json_decimal if exact else _json_float,
            parse_constant=_json_constant if finite else float,
            object_pairs_hook=_unique_keys if unique_keys else None,
        )
    except _Refused as exc:
        raise PgolfError(f"{where}: {exc}") from None
    except RecursionError:
        raise PgolfError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise PgolfError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise PgolfError(
            f"{where}: not valid JSON ({exc.msg.removesuffix(' at')} at character {exc.pos})"
        ) from None
    problem = _json_problem(value)
    if problem:
        raise PgolfError(f"{where}: {problem}")
    return value


def parse_toml(text: str, where: str, exact: bool = False) -> dict[str, Any]:
    """`text` parsed as TOML, or a PgolfError starting with `where`: not TOML, nested deeper than
    MAX_JSON_DEPTH, or an integer of more than MAX_INT_DIGITS digits (as `parse_json`). With `exact` the
    numbers with a fraction are Decimals, as written."""
    try:
        value = tomllib.loads(text, parse_float=Decimal if exact else float)
    except RecursionError:
        raise PgolfError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except tomllib.TOMLDecodeError as exc:
        raise PgolfError(f"{where}: not valid TOML ({exc})") from None
    except ValueError:  # Python's int refuses over 4,300 digits
        raise PgolfError(f"{where}: an integer of thousands of digits (at most {MAX_INT_DIGITS})") from None
    problem = _json_problem(value)
    if problem:
        raise PgolfError(f"{where}: {problem}")
    return value


def json_text(value: Any, **options: Any) -> str:
    """`value` as JSON that `parse_json` reads back: a float that is not finite (NaN, inf), which JSON
    cannot hold, written as null; `options` are json.dumps's (indent, default)."""
    return json.dumps(_finite(value), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


class _Refused(ValueError):
    """A JSON number the parser's hooks refuse."""


def _json_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(digits.lstrip('-')):,} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _json_float(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise _Refused(f"the number {number[:30]} is out of range")
    return value


def _json_decimal(number: str) -> Decimal:
    if len(number) > 100:
        raise _Refused(f"a number of {len(number):,} characters")
    return Decimal(number)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _Refused(f"{key!r} is given twice")
        found[key] = value
    return found


def _json_constant(name: str) -> float:
    raise _Refused(f"{name} is not a number JSON allows")


def _json_problem(value: Any) -> str | None:
    """What is wrong with a parsed JSON (or TOML) value: too deep, an integer too long, or a string with
    no UTF-8; None when nothing."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"nested deeper than {MAX_JSON_DEPTH} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "a string holds a lone surrogate (\\ud800-\\udfff alone), which is not text"
        elif isinstance(item, int) and len(str(abs(item))) > MAX_INT_DIGITS:
            return f"an integer of {len(str(abs(item))):,} digits (at most {MAX_INT_DIGITS})"
    return None
