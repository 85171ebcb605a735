"""A training run's promises: it stops within seconds when asked, fails by name when it diverges,
writes nothing non-finite, and shares its run directory (or a data folder) with no other writer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from core.artifact.checkpoint import save_checkpoint
from core.artifact.load import load_checkpoint
from core.common.errors import PgolfError
from core.common.files import WriterLock
from core.datasets.embedded import prepare_sotu
from core.train import loop, rundir
from core.train.rundir import RunDir
from tests.helpers import (
    IMPORTABLE,
    ROOT,
    assert_one_line_error,
    cli,
    data_flags,
    make_backend,
    make_checkpoint,
    needs,
    read_until,
)


class Stop(Exception):
    """Stands for the exception a signal asks the loop to raise (KeyboardInterrupt, Terminated)."""


def train_quietly(cfg, **kwargs):
    lines: list[str] = []
    backend = make_backend("cuda", cfg)
    try:
        return loop.train(backend, log=lines.append, **kwargs), lines
    finally:
        backend.close()


# ------------------------------------------------- a stop asked for after the last step
@needs("cuda")
def test_a_stop_after_the_last_step_skips_validation_and_export(sotu_dataset, tmp_path):
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=3)
    seen: list[str] = []
    backend = make_backend("cuda", cfg)
    steps = []

    def stop():
        steps.append(len(seen))
        return Stop() if any(line.startswith("step:3/3") for line in seen) else None

    try:
        with pytest.raises(Stop):
            loop.train(backend, log=seen.append, stop=stop)
    finally:
        backend.close()
    run = tmp_path / "r"
    assert not list(run.glob("final_model.*"))  # no export
    assert not any(
        "val_loss" in line for line in seen[seen.index(next(s for s in seen if s.startswith("step:3/3"))) :]
    )
    assert (
        load_checkpoint(run / "checkpoints" / "step_000003.safetensors").step == 3
    )  # whole, at the last step
    assert re.search(r"stopped at step 3: checkpoint \S+; export it with: export ", seen[-1]), seen[-1]


@needs("cuda")
@pytest.mark.slow  # one CLI run: ~5 s
def test_sigterm_after_the_last_step_ends_the_run_within_seconds(sotu_dataset, tmp_path):
    # GPTQ calibration stretches the time between the last step and the artifact.
    command = [sys.executable, str(ROOT / "cli.py"), "train", "--backend", "cuda", "--preset", "smoke",
               "--iterations", "3", "--train-log-every", "1", "--quant-format", "mixed", "--gptq-enabled",
               "--gptq-calibration-batches", "64", "--out-dir", str(tmp_path), "--run-id", "r",
               *data_flags(sotu_dataset)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_until(process, "step:3/3 train_loss")
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    stdout, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < 5.0
    assert process.returncode == 143, stderr
    assert stderr.strip().endswith("terminated")
    run = tmp_path / "r"
    assert not list(run.glob("final_model.*")) and "final_int6_roundtrip" not in stdout
    assert load_checkpoint(run / "checkpoints" / "step_000003.safetensors").step == 3


# ------------------------------------------------- a stop during the final scores (test-time training)
class Poll:
    """A stop poll with `release`, as the CLI's: records whether the last checkpoint was on disk then."""

    def __init__(self, run: Path):
        self.run, self.released_with = run, None

    def __call__(self):
        return None

    def release(self, note: str) -> None:
        assert (
            note.startswith("stopped after the last step: checkpoint ") and "export it with: export" in note
        )
        self.released_with = sorted(p.name for p in (self.run / "checkpoints").glob("*.safetensors"))
        assert not list(self.run.glob("final_model.*"))  # before the export


@needs("cuda")
def test_stops_are_released_once_the_last_checkpoint_is_written(sotu_dataset, tmp_path):
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=2)
    poll = Poll(tmp_path / "r")
    train_quietly(cfg, stop=poll)
    assert poll.released_with == ["step_000002.safetensors"]


def test_a_released_signal_is_raised_at_once_and_one_held_before_is_raised_on_release():
    import cli as cli_module

    signals = cli_module.Signals()
    with signals.held() as stop:
        signals.release()
        with pytest.raises(cli_module.Terminated):
            signals.handle(signal.SIGTERM, None)  # the final scores: at once
    with signals.held() as stop:
        signals.handle(signal.SIGINT, None)  # held: between the last poll and the release
        assert isinstance(stop(), KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            stop.release()


@needs("cuda")
@pytest.mark.slow  # one CLI run to its test-time training: ~10 s
def test_sigterm_during_trains_test_time_training_ends_it_within_seconds(sotu_dataset, tmp_path):
    command = [sys.executable, str(ROOT / "cli.py"), "train", "--backend", "cuda", "--preset", "smoke",
               "--iterations", "2", "--out-dir", str(tmp_path), "--run-id", "r", "--ttt-enabled",
               "--ttt-batch-size", "8", "--ttt-chunk-size", "8", "--ttt-eval-seq-len", "64",
               *data_flags(sotu_dataset)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Then the TTT score: its 4 documents in one batch, ~40 s on 2 cores, which a stop used to wait for.
    read_until(process, "final_int8_zlib_roundtrip_exact")
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    stdout, stderr = process.communicate(timeout=600)
    assert time.monotonic() - sent < 5.0
    assert process.returncode == 143 and stderr.strip().endswith("terminated"), stderr
    assert "stopped after the last step: checkpoint " in stderr  # where it is, how to export it
    assert "final_int8_zlib_ttt" not in stdout
    assert load_checkpoint(tmp_path / "r" / "checkpoints" / "step_000002.safetensors").step == 2


# ------------------------------------------------- divergence the old rule let through
@needs("cuda")
def test_a_run_worse_than_uniform_fails_by_name(sotu_dataset, tmp_path):
    """A huge embedding learning rate, 30 steps and no training log line: the weights stay small, and the
    run used to end "done" with a val_loss of 9.8, worse than predicting every token as equally likely."""
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=30, train_log_every=1000,
                              tied_embed_lr=10.0)  # fmt: skip
    with pytest.raises(PgolfError, match=r"training diverged: val_loss [\d.]+ at step 30 .* is 6\.9315\)"):
        train_quietly(cfg)
    assert not list((tmp_path / "r").glob("final_model.*"))
    assert "val" not in (tmp_path / "r" / "metrics.jsonl").read_text()  # no record of the diverged score


@needs("cuda")
def test_a_checkpoint_of_exploded_weights_is_refused_before_the_first_step(sotu_dataset, tmp_path):
    ckpt = make_checkpoint()
    ckpt.params = {k: np.full_like(v, 1e30) for k, v in ckpt.params.items()}  # finite, checksum valid
    ckpt.config = sotu_dataset.config(out_dir=str(tmp_path), iterations=6).to_dict()
    path = save_checkpoint(tmp_path / "exploded.safetensors", ckpt)
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=6)
    with pytest.raises(PgolfError, match=r"the weights' RMS is 1e\+30 .*resume from an earlier checkpoint"):
        train_quietly(cfg, resume=path)
    assert not (tmp_path / "r").exists()  # refused before the run directory


def test_no_checkpoint_is_written_of_non_finite_weights(tmp_path):
    assert loop.weights_rms({"a": np.array([3.0, 4.0]), "b": np.zeros(2)}) == pytest.approx(2.5)
    assert not loop.weights_rms({"a": np.array([np.nan])}) <= loop.WEIGHT_RMS_LIMIT
    assert not loop.weights_rms({"a": np.array([np.inf])}) <= loop.WEIGHT_RMS_LIMIT


# ------------------------------------------------- one writer per run directory, per data folder
def test_a_second_writer_of_a_run_directory_is_refused_naming_the_first(tmp_path):
    first = RunDir(tmp_path, "r")
    with pytest.raises(PgolfError, match=rf"run directory \S+ is in use by process {os.getpid()}"):
        RunDir(tmp_path, "r", reuse=True)
    first.close()
    RunDir(tmp_path, "r", reuse=True).close()  # free again


def test_a_lock_of_a_dead_process_never_blocks(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from core.common.files import WriterLock; "
         f"WriterLock({str(tmp_path)!r}, 'folder'); print('held', flush=True); time.sleep(60)"],
        env=os.environ | IMPORTABLE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(PgolfError, match=f"in use by process {holder.pid}"):
        WriterLock(tmp_path, "folder")
    holder.kill()
    holder.wait()
    WriterLock(tmp_path, "folder").release()  # the kernel dropped the dead holder's lock


@needs("cuda")
@pytest.mark.slow  # two CLI runs: ~8 s
def test_two_resumes_of_one_run_exactly_one_proceeds(sotu_dataset, tmp_path):
    done = cli("train", "--backend", "cuda", "--preset", "smoke", "--iterations", "2", "--out-dir",
               str(tmp_path), "--run-id", "r", *data_flags(sotu_dataset))  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = tmp_path / "r"
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "cli.py"), "train", "--backend", "cuda", "--resume", str(run),
         "--iterations", "100000", "--train-log-every", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        read_until(first, "step:3/")
        second = cli("train", "--backend", "cuda", "--resume", str(run), "--iterations", "100000")
        assert_one_line_error(second, f"run directory {run} is in use by process {first.pid}")
    finally:
        first.kill()
        first.communicate()


def test_two_prepares_of_one_data_folder_one_is_refused(tmp_path):
    with (
        WriterLock(tmp_path, "data folder"),
        pytest.raises(PgolfError, match=f"in use by process {os.getpid()}"),
    ):
        prepare_sotu(tmp_path, vocab_size=1024, limit_docs=40)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, the lock's pid file gone


def test_a_run_directory_whose_first_write_fails_is_removed(tmp_path, monkeypatch):
    def full_disk(path, data):
        raise PgolfError(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(rundir, "write_atomic", full_disk)
    run = RunDir(tmp_path, "r")
    with pytest.raises(PgolfError, match="No space left"):
        run.write_config({"iterations": 1})
    assert not (tmp_path / "r").exists()
    Path(tmp_path / "kept").mkdir()
    kept = RunDir(tmp_path, "kept", reuse=True)  # an existing directory is never removed
    with pytest.raises(PgolfError):
        kept.write_config({})
    assert (tmp_path / "kept").is_dir()


def test_an_artifact_keeping_settings_of_the_wrong_type_or_out_of_range_is_refused_by_name(tmp_path):
    from core.artifact import int8, int8_format
    from core.config.presets import preset
    from core.model.params import artifact_classes, init_params, storage_dtypes
    from core.runs.setup import scoring_config

    cfg = preset("smoke")
    model = int8_format.quantize_int8(init_params(cfg), storage_dtypes(cfg, False), artifact_classes(cfg))
    wrong = ({"num_layers": [1, 2]}, {"rope_dims": "wide"}, {"ln_scale": 3.5})
    out_of_range = ({"num_layers": 0}, {"eval_stride": -5}, {"muon_backend_steps": 10**6}, {"num_heads": 3})
    for kept in wrong + out_of_range:
        path = tmp_path / "a.pgolf"
        int8.write_artifact(
            path, int8_format.artifact_bytes(model, "zlib", config=kept), "zlib"
        )  # its checksum is valid: written so
        with pytest.raises(PgolfError, match=rf"artifact {path} keeps settings pgolf refuses: config: "):
            scoring_config(path, None, None, {})
