"""What only pgolf's `train` asks of a training run: to resume it, to stop it on a signal, and to show
its progress (a packaged train_gpt.py does none of these, so this code stays out of its bundle,
core/runs/package.py).

`resume`: the checkpoint `Training.resume` names, checked and loaded into the run; `resumes_in`:
whether that checkpoint is the run directory's own.
`stopped_note`, `release_note`: what a stopped run tells its user to do next.
`expected_steps`: the total of the training steps' progress display.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from core.artifact.load import check_resumable, load_checkpoint, restore_data_position
from core.common.errors import PgolfError, hint, setting
from core.train.loop import WEIGHT_RMS_LIMIT, weights_rms

if TYPE_CHECKING:
    from core.train.loop import Training


def resume(training: Training) -> float:
    """Load the checkpoint to resume from into the backend, the data loader and the step counter;
    return its training clock."""
    cfg, path = training.cfg, training.resume
    ckpt = load_checkpoint(path)
    rms = weights_rms(ckpt.params)
    if not rms <= WEIGHT_RMS_LIMIT:
        raise PgolfError(
            f"checkpoint {path}: the weights' RMS is {rms:.3g} (the limit is "
            f"{WEIGHT_RMS_LIMIT:g}): the run had diverged; resume from an earlier checkpoint"
        )
    check_resumable(cfg, ckpt, path)
    if ckpt.step > cfg.iterations:
        raise PgolfError(
            f"checkpoint {path} is at step {ckpt.step}, past iterations={cfg.iterations}: "
            f"raise {setting('iterations')} to train on"
        )
    training.backend.load_params(ckpt.params)
    training.backend.load_optimizer_state(ckpt.optimizer)
    restore_data_position(training.loader, ckpt.data_state)
    training.step = ckpt.step
    return ckpt.train_time_ms


def resumes_in(checkpoint: str | Path, run_dir: Path) -> bool:
    """Whether the checkpoint is one of `run_dir`'s: a resumed run goes on writing into its own
    directory, and into no other run's."""
    return Path(checkpoint).resolve().is_relative_to(run_dir.resolve())


def _export_it(checkpoint: Path, run_dir: Path) -> str:
    return f"export it with: export {checkpoint}, or score and export it with: train --resume {run_dir}"


def stopped_note(training: Training, checkpoint: Path) -> str:
    """The line a run stopped between steps logs: where its checkpoint is, and how to go on from it."""
    if training.step < training.cfg.iterations and training.stop_after is None:
        then = f"go on with: train --resume {training.run.path}"
    else:  # training is over: what is left is the final score and the artifact
        then = _export_it(checkpoint, training.run.path)
    then = hint(f"; {then}", "")  # a packaged train_gpt.py does not resume: pgolf does
    return f"stopped at step {training.step}: checkpoint {checkpoint}{then}"


def release_note(training: Training) -> str:
    """What a stop during the export and the final scores says: the last checkpoint is on disk."""
    checkpoint = training.run.checkpoint_path(training.step)
    return (
        f"stopped after the last step: checkpoint {checkpoint}; {_export_it(checkpoint, training.run.path)}"
    )


def expected_steps(training: Training) -> int:
    """Where the run will stop: the iterations, or the cap at the current pace when it comes first."""
    cfg, step = training.cfg, training.step
    cap_s = cfg.train_cap_seconds
    if cap_s <= 0:
        return cfg.iterations
    elapsed = training.clock.ms()
    ms_per_step = max((elapsed - training.first_ms) / (step - training.first_step), 1e-9)
    left = math.ceil(max(1000.0 * cap_s - elapsed, 0.0) / ms_per_step)
    return min(cfg.iterations, step + left)
