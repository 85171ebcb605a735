"""Live metrics: the records a run writes to metrics.jsonl, mirrored to a tracker as they come.

`report_to` names the trackers (comma-separated): `tensorboard` writes event files under
the run directory (`tensorboard --logdir runs` shows every run; no account), `wandb` and
`trackio` log to their own services through their shared `init` / `log` / `finish` API.
Each is an optional package, imported only when asked for. A record becomes scalars named
`<kind>/<field>` (e.g. `train/train_loss`, `val/val_bpb`) at its step. A run imports this module
only when `report_to` names a tracker (a packaged run reports to none).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError, did_you_mean

# Each tracker: the module it needs, and how to install it.
TRACKERS = {
    "tensorboard": ("tensorboardX", "pip install 'pgolf[tensorboard]'"),
    "wandb": ("wandb", "pip install wandb"),
    "trackio": ("trackio", "pip install trackio"),
}
PROJECT = "pgolf"  # the wandb / trackio project the runs go to


class Reporter:
    """A tracker the metrics records go to (core.train.rundir.RunDir.metric)."""

    def record(self, record: dict[str, Any]) -> None:
        found = scalars(record)
        if found is not None:
            self.log(*found)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def report_targets(report_to: str) -> list[str]:
    """The trackers `report_to` names, each checked to be known and installed."""
    names = [part.strip() for part in report_to.split(",") if part.strip()]
    for name in names:
        if name not in TRACKERS:
            raise PgolfError(
                f"config: report_to: unknown tracker {name!r}{did_you_mean(name, TRACKERS)} "
                f"(choose from {', '.join(TRACKERS)})"
            )
        module, install = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise PgolfError(f"config: report_to {name} needs the {module} package: {install}")
    return names


def scalars(record: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """A metrics record as (step, {'<kind>/<field>': number}); None for records with no step."""
    step = record.get("step", record.get("steps"))
    if not isinstance(step, int) or record.get("kind") == "start":
        return None
    values = {
        f"{record['kind']}/{key}": float(value)
        for key, value in record.items()
        if key not in ("kind", "step", "steps")
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }
    return step, {k: v for k, v in values.items() if math.isfinite(v)}


class TensorBoard(Reporter):
    def __init__(self, run_path: Path, name: str, config: dict[str, Any]):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(run_path / "tensorboard"), flush_secs=10)
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # each record is on disk for a watcher at once

    def close(self) -> None:
        self.writer.close()


class WandbLike(Reporter):
    """wandb, or trackio (which follows wandb's API)."""

    def __init__(self, module_name: str, name: str, config: dict[str, Any]):
        self.module = importlib.import_module(module_name)
        self.module.init(project=PROJECT, name=name, config=config)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.module.log(scalars, step=step)

    def close(self) -> None:
        self.module.finish()


def open_reporters(targets: list[str], run_path: Path, name: str, config: dict[str, Any]) -> list[Reporter]:
    return [
        TensorBoard(run_path, name, config) if target == "tensorboard" else WandbLike(target, name, config)
        for target in targets
    ]
