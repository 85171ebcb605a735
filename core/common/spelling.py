"""Suggestions for a misspelt name, for the commands' error lines (a training run never needs one)."""

from __future__ import annotations

import difflib
from typing import Any


def did_you_mean(name: str, choices: Any) -> str:
    """' (did you mean X?)' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
