"""A training run as pgolf's `train` manages it (`ManagedTraining`, through the hooks of core.train.loop's
`Training`): checkpoints written and resumed from, `init_from`'s weights, the artifact fitted under
`artifact_fit_bytes`, metrics mirrored to the trackers of `report_to`, a stop on a signal, progress,
notes, and the digests of its data. A packaged train_gpt.py runs the bare `Training`.

`resume`: the checkpoint `ManagedTraining.resume` names, checked and loaded into the run; `resumes_in`:
whether that checkpoint is the run directory's own.
`stopped_note`, `release_note`: what a stopped run tells its user to do next.
`expected_steps`: the total of the training steps' progress display.
`reference_bpb`: a reference run's val_bpb at a step, which `abort_behind` compares a run's with.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.artifact.budget import format_budget
from core.artifact.checkpoint import Checkpoint, save_checkpoint
from core.artifact.export import ExportReport, quant_label
from core.artifact.load import check_resumable, load_checkpoint, load_init_weights, restore_data_position
from core.common.errors import PgolfError, hint, setting
from core.config.fields import Config
from core.data.provenance import data_record
from core.train.fitting import fit_in_run, write_fit_in_run
from core.train.loop import WEIGHT_RMS_LIMIT, RunResult, Training, rank_mean, run_to_end, weights_rms
from core.train.report import open_reporters, report_targets
from core.train.rundir import RunDir

if TYPE_CHECKING:
    from core.artifact.mixed import MixedModel
    from core.eval.bpb import Progress
    from core.model.backend import Backend

# Whether a stop was asked for (Ctrl-C): None, or what to raise once a checkpoint is written. When the
# poll has a `release(note)` method too, the loop calls it once its last checkpoint is on disk: from then
# on, through the export and the final scores (test-time training: minutes), a stop may end the run at
# once, saying the note (where the checkpoint is, how to export it).
StopPoll = Callable[[], BaseException | None]


def train_managed(backend: Backend, **options) -> RunResult:
    """Train, validate and export one model with `backend.cfg` as pgolf's `train` does (checkpoints,
    resuming, stopping, progress, notes, init_from, the artifact fit, trackers); return the final figures.
    `options` are ManagedTraining's; `code_bytes` may be a function of the config the artifact is
    written with (the CLI passes core.runs.train_script.code_bytes)."""
    return run_to_end(ManagedTraining(backend, **options))


class BehindReference(PgolfError):
    """A run stopped at a validation behind its reference run (abort_behind): its checkpoint is written."""

    status = 4  # the exit status it ends `train` with (docs/commands.md)


class ManagedTraining(Training):
    """A training run as pgolf's `train` drives it: it writes a checkpoint after the last step, every
    checkpoint_every steps, every checkpoint_minutes and when stopped. Besides `Training`'s options
    (`code_bytes` may be a function of the config, see `artifact_settings`): `resume` (a checkpoint,
    or a run directory's last one); `progress` follows each validation pass and `step_progress` the
    training steps, as (done, expected total); under a wallclock cap the total is where the cap will stop
    the run at the current pace. `notes` are logged after the header (where settings came from,
    warnings); `stop` is polled between steps (see `stop_if_asked`). `reference`: the validations
    (step, val_bpb) of the run `abort_behind` names (core.runs.summary.val_curve reads them)."""

    def __init__(
        self,
        backend: Backend,
        resume: str | Path | None = None,
        progress: Progress | None = None,
        step_progress: Progress | None = None,
        notes: Sequence[str] = (),
        stop: StopPoll | None = None,
        reference: Sequence[tuple[int, float]] = (),
        **options,
    ):
        super().__init__(backend, **options)
        if self.cfg.abort_behind and not reference:
            raise PgolfError(
                f"abort_behind={self.cfg.abort_behind}: the reference run's validations are needed"
            )
        self.reference = list(reference)
        self.resume, self.progress, self.step_progress = resume, progress, step_progress
        self.notes, self.stop = notes, stop
        self.saved_step: int | None = None  # the step of the last checkpoint written
        self.saved_ms: float | None = None  # and the training clock then
        self.timed_checkpoint: Path | None = None  # the last one written for checkpoint_minutes

    def start(self) -> None:
        """Then the data the run reads, as digests (core/data/provenance.py): `runs` shows them, `package`
        compares the seeds'."""
        super().start()
        if self.main:
            record = data_record(self.cfg.data_path, self.cfg.tokenizer_path)
            self.metric(**record)
            self.say(" ".join(f"{k}:{v}" for k, v in record.items() if k != "kind"))

    def load_weights(self) -> float:
        """A checkpoint's weights and state to resume from, else `init_from`'s weights (with a fresh
        optimizer, at step 0), else seeded ones."""
        cfg = self.cfg
        if self.resume is not None:
            return resume(self)
        if cfg.init_from:
            self.backend.load_params(load_init_weights(cfg.init_from, cfg))
            return 0.0
        return super().load_weights()

    def open_run_dir(self, run_id: str) -> RunDir:
        """The run directory (a resumed run's own, when it resumes in it), its metrics mirrored to the
        trackers of `report_to` (core/train/report.py), which are checked before it is made."""
        trackers = report_targets(self.cfg.report_to)
        own_run = self.resume is not None and resumes_in(self.resume, Path(self.cfg.out_dir) / run_id)
        run = RunDir(self.cfg.out_dir, run_id, enabled=self.main, reuse=own_run)
        if run.enabled and trackers:  # rank 0 mirrors the metrics to them from now on
            run.reporters = open_reporters(trackers, run.path, run.run_id, self.cfg.to_dict())
        return run

    def warm_up(self) -> None:
        if self.resume is None:  # a resumed run's weights are not the initial ones to restore
            super().warm_up()

    def agreed_ms(self) -> float:
        """Timed checkpoints read the clock too: several ranks agree on it under checkpoint_minutes."""
        if self.cfg.checkpoint_minutes > 0:
            return rank_mean(self.backend, self.clock.ms())
        return super().agreed_ms()

    def artifact_settings(
        self, params: dict[str, np.ndarray], hessians: dict[str, np.ndarray] | None
    ) -> tuple[Config, MixedModel | None, Sequence[Path]]:
        """With `artifact_fit_bytes`, the settings the fit chose under that cap (every rank gets rank 0's
        choice, core/train/fitting.py); rank 0 writes the fit's files beside the artifact and returns
        the shards its calibration read. A `code_bytes` function is measured here, on that config."""
        cfg, quantized, shards = super().artifact_settings(params, hessians)
        if cfg.artifact_fit_bytes > 0:
            cfg, fit = fit_in_run(self, params, hessians)
            self.stop_if_asked()
            if fit is not None:  # rank 0
                quantized = fit.model
                shards = write_fit_in_run(fit, self.run_dir.artifact(quant_label(cfg)), self.say)
        if callable(self.code_bytes):
            self.code_bytes = self.code_bytes(cfg) if self.main else 0
        return cfg, quantized, shards

    def wrote_artifact(self, report: ExportReport, cfg: Config, params: dict[str, np.ndarray]) -> None:
        """Where the artifact's bytes go, class by class (core/artifact/budget.py), after its size."""
        for line in format_budget(report, cfg, params):
            self.say(line)

    def _log_header(self) -> None:
        if self.resume is not None:
            self.say(f"resumed:{self.resume} step:{self.step} train_time:{self.clock.ms():.0f}ms")
        super()._log_header()
        if self.cfg.init_from and self.resume is None:
            self.say(f"init_from:{self.cfg.init_from} (its weights, a fresh optimizer, step 0)")
        for note in self.notes:
            self.say(note)

    def train_step(self) -> None:
        super().train_step()
        self.save_periodic_checkpoint()

    def validate(self) -> None:
        super().validate()
        if self.cfg.abort_behind:
            self.stop_if_behind()

    def stop_if_behind(self) -> None:
        """Stop with a checkpoint when this validation's val_bpb is above the reference run's at this step by
        more than abort_margin (no comparison outside the reference's validations). The figures are
        the same on every rank, so all ranks stop alike."""
        cfg = self.cfg
        theirs = reference_bpb(self.reference, self.step)
        if theirs is None or not self.val_bpb > theirs + cfg.abort_margin:
            return
        path = (
            self.run_dir.checkpoint_path(self.step)
            if self.saved_step == self.step
            else self.save_checkpoint()
        )
        line = (
            f"stopped at step {self.step}, behind the reference: val_bpb {self.val_bpb:.4f}, {cfg.abort_behind}'s "
            f"{theirs:.4f} at that step (+{self.val_bpb - theirs:.4f}, more than abort_margin {cfg.abort_margin:g}); "
            f"checkpoint {path}"
        )
        if self.main:
            self.run_dir.log_line(line)
        self.metric(kind="stopped", why=f"behind {cfg.abort_behind}", step=self.step, val_bpb=self.val_bpb,
                    reference_val_bpb=theirs, abort_margin=cfg.abort_margin)  # fmt: skip
        raise BehindReference(line)

    def save_checkpoint(self) -> Path:
        """Rank 0 writes; every rank's clock stops until it is on disk."""
        super().save_checkpoint()
        self.saved_step, self.saved_ms = self.step, self.elapsed_ms
        return self.run_dir.checkpoint_path(self.step)

    def write_checkpoint(self, params: dict[str, np.ndarray]) -> None:
        save_checkpoint(
            self.run_dir.checkpoint_path(self.step),
            Checkpoint(
                params=params,
                optimizer=self.backend.optimizer_state(),
                config=self.cfg.to_dict(),
                step=self.step,
                train_time_ms=self.clock.ms(),
                data_state=self.loader.state(),
                backend=self.backend.name,
                dtypes=self.dtypes,
            ),
        )

    def save_periodic_checkpoint(self) -> None:
        """Every checkpoint_every steps, and every checkpoint_minutes of training time (the clock the
        ranks agree on), but not at the last step, whose checkpoint comes after validation. A timed
        checkpoint replaces the timed one before it, so that long runs do not fill the disk."""
        cfg = self.cfg
        if self.step >= cfg.iterations:
            return
        by_steps = cfg.checkpoint_every > 0 and self.step % cfg.checkpoint_every == 0
        minutes = cfg.checkpoint_minutes
        since = self.first_ms if self.saved_ms is None else self.saved_ms  # the clock at the last one
        timed = minutes > 0 and self.elapsed_ms - since >= 60_000.0 * minutes
        if not (by_steps or timed):
            return
        path = self.save_checkpoint()
        if by_steps:
            return
        if self.main and self.timed_checkpoint is not None:
            self.timed_checkpoint.unlink(missing_ok=True)
        self.timed_checkpoint = path

    def after_step(self) -> None:
        if self.main and self.step_progress is not None:
            self.step_progress(self.step, expected_steps(self))

    def trained(self) -> None:
        if self.main and self.step_progress is not None:
            self.step_progress(self.step, self.step)  # training is over, wherever it stopped
        release = getattr(self.stop, "release", None)
        if release is not None:  # nothing is left to save: a stop need not wait for a poll
            release(release_note(self))

    def stop_if_asked(self) -> None:
        """Write a checkpoint, say where it is and raise, when a stop was asked for (a signal)."""
        exc = self.stop() if self.stop is not None else None
        if exc is None:
            return
        path = (
            self.run_dir.checkpoint_path(self.step)
            if self.saved_step == self.step
            else self.save_checkpoint()
        )
        self.say(stopped_note(self, path))
        raise exc

    def watch(self, done: int, total: int) -> None:
        """A stop is honoured within a pass, batch by batch."""
        self.stop_if_asked()
        if self.main and self.progress is not None:
            self.progress(done, total)


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
        then = f"go on with: train --resume {training.run_dir.path}"
    else:  # training is over: what is left is the final score and the artifact
        then = _export_it(checkpoint, training.run_dir.path)
    then = hint(f"; {then}", "")  # a packaged train_gpt.py does not resume: pgolf does
    return f"stopped at step {training.step}: checkpoint {checkpoint}{then}"


def release_note(training: Training) -> str:
    """What a stop during the export and the final scores says: the last checkpoint is on disk."""
    checkpoint = training.run_dir.checkpoint_path(training.step)
    return f"stopped after the last step: checkpoint {checkpoint}; {_export_it(checkpoint, training.run_dir.path)}"


def reference_bpb(curve: Sequence[tuple[int, float]], step: int) -> float | None:
    """The reference's val_bpb at `step` from its validations (step, val_bpb) sorted by step: linear
    between the two around it; None before its first or after its last."""
    steps = [s for s, _ in curve]
    if not steps or not steps[0] <= step <= steps[-1]:
        return None
    i = bisect.bisect_left(steps, step)
    if steps[i] == step:
        return curve[i][1]
    (s0, v0), (s1, v1) = curve[i - 1], curve[i]
    return v0 + (v1 - v0) * (step - s0) / (s1 - s0)


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
