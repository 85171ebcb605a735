"""One exception type for every user-facing problem.

The CLI turns a `PgolfError` into a single line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
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
