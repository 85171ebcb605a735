"""cli.py as torchrun starts it, with a fault injected into one rank: a test helper, not part of pgolf.

tests/test_training.py runs `torchrun ... tests/torchrun_cli.py train ...`; these environment
variables, read here only, pick what to inject:
- TEST_PID_DIR: each rank writes its process id to rank<RANK>.pid there;
- TEST_FAIL_RANK, TEST_FAIL_STEP, TEST_FAIL_MESSAGE: that rank raises RuntimeError(message)
  instead of taking its step number TEST_FAIL_STEP; or, given TEST_STALL_SECONDS, it sleeps that
  long first, as a hung rank would;
- TEST_CORPUS_DOCS: the embedded corpus keeps its first N speeches (a quick first-use preparation);
- TEST_FIT_SLEEP_SECONDS: the artifact fit (rank 0's) sleeps that long first, as a long fit would.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # instead of tests/

import cli  # noqa: E402
import core.datasets.embedded  # noqa: E402
import core.train.fitting  # noqa: E402
import core.train.loop  # noqa: E402


def inject(env: dict[str, str], rank: int) -> None:
    if "TEST_PID_DIR" in env:
        (Path(env["TEST_PID_DIR"]) / f"rank{rank}.pid").write_text(str(os.getpid()))
    if "TEST_CORPUS_DOCS" in env:
        all_files, docs = core.datasets.embedded.speech_files, int(env["TEST_CORPUS_DOCS"])
        core.datasets.embedded.speech_files = lambda: all_files()[:docs]
    if "TEST_FIT_SLEEP_SECONDS" in env:
        seconds, fit = float(env["TEST_FIT_SLEEP_SECONDS"]), core.train.fitting.fit_on_backend

        def slow_fit(*args, **kwargs):
            time.sleep(seconds)
            print(f"test: the fit slept {seconds:g} s first", flush=True)
            return fit(*args, **kwargs)

        core.train.fitting.fit_on_backend = slow_fit
    if env.get("TEST_FAIL_RANK") == str(rank):
        step, take_step = int(env["TEST_FAIL_STEP"]), core.train.loop.Training.train_step

        def train_step(self) -> None:
            if self.step + 1 == step and "TEST_STALL_SECONDS" in env:
                time.sleep(float(env["TEST_STALL_SECONDS"]))
            elif self.step + 1 == step:
                raise RuntimeError(env["TEST_FAIL_MESSAGE"])
            take_step(self)

        core.train.loop.Training.train_step = train_step


if __name__ == "__main__":
    inject(dict(os.environ), int(os.environ.get("RANK", "0")))
    sys.argv[0] = str(ROOT / "cli.py")
    cli.main()
