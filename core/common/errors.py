"""One exception type for every user-facing problem.

The CLI turns a `PgolfError` into a single line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator
from typing import Any


class PgolfError(Exception):
    """A problem with the user's input (file, flag, config), explained in one line."""


def first_line(exc: BaseException) -> str:
    """What a low-level failure (a decoder's, a parser's) says, as one short line for a PgolfError."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def did_you_mean(name: str, choices: Any) -> str:
    """' (did you mean X?)' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
