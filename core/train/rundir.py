"""The run directory as a training run writes it (only rank 0 writes).

A run directory holds:
    config.json          the resolved config
    metrics.jsonl        one JSON record per line: kind = start (backend, device; once per start or
                         resume) | data (the digests of the data read: pgolf's `train` only) | train | val
                         | final (the scores, sizes and each evaluation's wall time)
    train.log            the console lines
    checkpoints/step_NNNNNN.safetensors
    .writer.pid          while a process writes the run (one at a time, core.common.files.WriterLock)
    final_model.<label>.pgolf   the artifact: int8, int6, ... (core.artifact.export.quant_label)

Reading it back (summaries, plots) is core/runs/.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError, setting
from core.common.files import WriterLock, append_line, make_dir, remove_stale_temps, write_atomic


def config_digest(config: dict[str, Any]) -> str:
    """The SHA-256 of a config as config.json holds it: each start of a run logs it in metrics.jsonl, beside
    its scores, so a config.json edited or lost after the run is told apart from the one it trained with."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


class RunDir:
    """The files of one training run; only rank 0 writes."""

    def __init__(self, root: str | Path, run_id: str, enabled: bool = True, reuse: bool = False):
        """`reuse` lets a resumed run write into a directory that already holds a run."""
        self.run_id = run_id
        self.path = Path(root) / run_id
        self.enabled = enabled
        self.reporters: list[Any] = []  # live trackers the metrics go to as well (core.train.report)
        self.lock: WriterLock | None = None
        if not enabled:
            return
        taken = f"run directory {self.path} already holds a run: choose another {setting('run_id')}"
        if not reuse and (self.path / "config.json").exists():
            raise PgolfError(taken)
        self.fresh = not self.path.exists()  # removed again if its first write fails
        make_dir(self.path, "run directory")
        self.lock = WriterLock(self.path, "run directory")  # before anything is written
        if not reuse and (self.path / "config.json").exists():  # written meanwhile by another run
            self.close()
            raise PgolfError(taken)
        make_dir(self.path / "checkpoints", "run directory")
        # A killed run's temp files, when resuming it (those beside config.json go as write_config writes it).
        remove_stale_temps(self.path / "checkpoints")

    def artifact(self, label: str) -> Path:
        return self.path / f"final_model.{label}.pgolf"

    def checkpoint_path(self, step: int) -> Path:
        return self.path / "checkpoints" / f"step_{step:06d}.safetensors"

    def write_config(self, config: dict[str, Any]) -> None:
        """The run's first write: a new directory it cannot write (a full disk) is removed again."""
        if not self.enabled:
            return
        try:
            write_atomic(self.path / "config.json", (json.dumps(config, indent=2) + "\n").encode())
        except PgolfError:
            if self.fresh:
                self.close()
                shutil.rmtree(self.path, ignore_errors=True)
            raise

    def metric(self, record: dict[str, Any]) -> None:
        if self.enabled:
            append_line(self.path / "metrics.jsonl", json.dumps(record, default=str))  # a Path as its text
            for reporter in self.reporters:
                reporter.record(record)

    def close(self) -> None:
        """Close the trackers and let another writer in (the files need no closing)."""
        for reporter in self.reporters:
            reporter.close()
        self.reporters = []
        if self.lock is not None:
            self.lock.release()

    def log_line(self, line: str) -> None:
        if self.enabled:
            append_line(self.path / "train.log", line)
