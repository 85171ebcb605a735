"""One exception type for every user-facing problem.

The CLI turns a `PgolfError` into a single line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""


class PgolfError(Exception):
    """A problem with the user's input (file, flag, config), explained in one line."""


def first_line(exc: BaseException) -> str:
    """What a low-level failure (a decoder's, a parser's) says, as one short line for a PgolfError."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
