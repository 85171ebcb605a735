"""One exception type for every user-facing problem.

The CLI turns a `PgolfError` into a single line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""


class PgolfError(Exception):
    """A problem with the user's input (file, flag, config), explained in one line."""
