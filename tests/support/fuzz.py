"""Fuzzing for the tests: hypothesis's settings (PGOLF_FUZZ_EXAMPLES cases a test), and a call failed as a
hang when it outlasts HANG_SECONDS."""

from __future__ import annotations

import os
import threading

from hypothesis import HealthCheck, settings

FUZZ_EXAMPLES = int(os.environ.get("PGOLF_FUZZ_EXAMPLES", "60"))


HANG_SECONDS = 20.0


FUZZ = settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def run_within(seconds: float, fn, unblock=None) -> tuple[object, BaseException | None]:
    """(fn()'s result, None) or (None, what it raised), failing the test when fn takes longer than
    `seconds` (a hang, or a read that never ends); `unblock()` is then called to free it."""
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["done"] = (fn(), None)
        except BaseException as exc:  # handed to the test's thread
            outcome["done"] = (None, exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() and unblock is not None:
        unblock()
    assert "done" in outcome, f"still running after {seconds} s"
    return outcome["done"]
