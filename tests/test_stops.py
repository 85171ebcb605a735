"""A training run stops within seconds when asked, after its last step and during its final scores."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from core.artifact.load import load_checkpoint
from core.train.managed import train_managed
from tests.support.backends import make_backend, needs
from tests.support.cli import data_flags, read_until, start_cli
from tests.support.runs import train_quietly


class Stop(Exception):
    """Stands for the exception a signal asks the loop to raise (KeyboardInterrupt, Terminated)."""


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
            train_managed(backend, log=seen.append, stop=stop)
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
    process = start_cli("train", "--backend", "cuda", "--preset", "smoke", "--iterations", "3",
                        "--train-log-every", "1", "--quant-format", "mixed", "--gptq-enabled",
                        "--gptq-calibration-batches", "64", "--out-dir", str(tmp_path), "--run-id", "r",
                        *data_flags(sotu_dataset))  # fmt: skip
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
    process = start_cli("train", "--backend", "cuda", "--preset", "smoke", "--iterations", "2", "--out-dir",
                        str(tmp_path), "--run-id", "r", "--ttt-enabled", "--ttt-batch-size", "8",
                        "--ttt-chunk-size", "8", "--ttt-eval-seq-len", "64", *data_flags(sotu_dataset))  # fmt: skip
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
