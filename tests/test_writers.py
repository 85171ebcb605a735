"""One writer per run directory and per data folder; a run directory whose first write fails is removed,
and an artifact keeping settings of the wrong type is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.common.errors import PgolfError
from core.common.files import WriterLock
from core.datasets.embedded import prepare_sotu
from core.train import rundir
from core.train.rundir import RunDir
from tests.support import ROOT
from tests.support.backends import needs
from tests.support.cli import IMPORTABLE, assert_one_line_error, cli, data_flags, read_until


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
    from core.artifact import container, int8_format
    from core.config.presets import preset
    from core.model.params import artifact_classes, init_params, storage_dtypes
    from core.runs.setup import scoring_config

    cfg = preset("smoke")
    model = int8_format.quantize_int8(init_params(cfg), storage_dtypes(cfg, False), artifact_classes(cfg))
    wrong = ({"num_layers": [1, 2]}, {"rope_dims": "wide"}, {"ln_scale": 3.5})
    out_of_range = ({"num_layers": 0}, {"eval_stride": -5}, {"muon_backend_steps": 10**6}, {"num_heads": 3})
    for kept in wrong + out_of_range:
        path = tmp_path / "a.pgolf"
        container.write_artifact(
            path, int8_format.artifact_bytes(model, "zlib", config=kept), "zlib"
        )  # its checksum is valid: written so
        with pytest.raises(PgolfError, match=rf"artifact {path} keeps settings pgolf refuses: config: "):
            scoring_config(path, None, None, {})
