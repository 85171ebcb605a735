"""One exception type for every user-facing problem.

The CLI turns a `PgolfError` into a single line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator
from typing import Any

# Who reads the messages: the CLI's user (False), or a packaged train_gpt.py's (True), whose settings are
# environment variables and beside which there is no cli.py. The packaged script sets it as it starts.
PACKAGED = False


class PgolfError(Exception):
    """A problem with the user's input (file, flag, config), explained in one line."""

    status = 1  # the exit status it ends a command with (docs/commands.md)


class OverBudget(PgolfError):
    """A finished run whose artifact + code exceed the byte cap (budget_bytes): scored, but not submittable."""

    status = 3


def setting(name: str, value: Any = None) -> str:
    """How the reader sets config field `name` (to `value`): `--compressor brotli`, or in a packaged
    train_gpt.py `COMPRESSOR=brotli` (an on/off field: `--caseops-enabled`, `CASEOPS_ENABLED=1`)."""
    if PACKAGED:
        return name.upper() + (
            "" if value is None else f"={int(value) if isinstance(value, bool) else value}"
        )
    flag = "--" + name.replace("_", "-")
    return flag if value is None or value is True else f"{flag} {value}"


def hint(cli: str, packaged: str) -> str:
    """The advice that fits the reader: the CLI's, or a packaged train_gpt.py's."""
    return packaged if PACKAGED else cli


def one_line(exc: BaseException) -> str | None:
    """The line a user's problem ends a command with (a PgolfError, or a file problem not caught nearer its
    cause); None for anything else: a bug, whose traceback is shown."""
    if isinstance(exc, PgolfError):
        return f"error: {exc}"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"error: {exc.strerror or exc}{where}"
    return None


def first_line(exc: BaseException) -> str:
    """What a low-level failure (a decoder's, a parser's) says, as one short line for a PgolfError."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# What the frameworks say when an allocation fails: PyTorch on the CPU ("DefaultCPUAllocator: can't
# allocate memory", "not enough memory") and on CUDA ("CUDA out of memory"), MLX on Metal.
_OUT_OF_MEMORY = (
    "out of memory",
    "can't allocate memory",
    "not enough memory",
    "failed to allocate",
    "insufficient memory",
    "attempting to allocate",
)


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is a failed allocation: MemoryError, or a framework's RuntimeError saying so."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(words in text for words in _OUT_OF_MEMORY)


@contextlib.contextmanager
def memory_hint(doing: str, lower: str) -> Iterator[None]:
    """Out of memory inside the block: one PgolfError saying what was under way (`doing`) and which
    settings to lower (`lower`, flags)."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        raise PgolfError(f"out of memory during {doing} ({first_line(exc)}): lower {lower}") from None


def did_you_mean(name: str, choices: Any) -> str:
    """' (did you mean X?)' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
